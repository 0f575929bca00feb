#!/usr/bin/env bash
# Serve the student's rollouts, the server that `use_vllm: true, vllm_mode: server` talks to, then
# wait until it answers /health. On GPUs, vLLM's own `vllm serve` with what TRL 1.16's deprecated
# `trl vllm-serve` would add (trl/scripts/vllm_serve.py): dev mode and the NCCL weight-transfer
# engine. With --cpu, vLLM's server on its CPU engine (`make vllm-env`) with the same settings but
# the shared-memory weight reload (vllm_weight_transfer: shm, zppo_trl/vllm_worker.py) for NCCL.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
    cat <<USAGE
usage: serve_student.sh --model MODEL [options]

  --model MODEL        the student checkpoint (Hub id or path), e.g. Qwen/Qwen3.5-0.8B
  --gpus LIST          CUDA_VISIBLE_DEVICES for the server (default: all visible)
  --data-parallel N    vLLM data-parallel replicas, one per GPU (default: 1)
  --port PORT          HTTP port (default: 8001; the recipes' vllm_server_port)
  --host HOST          bind address (default: 0.0.0.0)
  --max-model-len N    context length (default: 21504, the paper's recipes: 4,096 prompt + an NCQ
                       block of 8 candidates + 12,288 completion; train.sh and the Slurm script
                       size it from your recipe: python recipes/zppo.py --config YAML --print_server_lengths)
  --timeout S          seconds to wait for health (default: 1800)
  --log FILE           server log (default: student_vllm.log)
  --cpu                vLLM's CPU engine instead of GPUs: \$VLLM_PYTHON (default .venv-vllm/bin/python,
                       built by \`make vllm-env\`) runs the server, in dev mode with the worker
                       extension that reloads the trainer's weights from /dev/shm; --gpus and
                       --data-parallel do not apply
  --kv-cache-gib N     with --cpu: KV-cache memory in GiB (default: 2)
  --cpu-cores LIST     with --cpu: the cores vLLM binds its engine to, e.g. 1 or 0-3 (default: vLLM's
                       choice, the first core: give a second server on the machine other cores)
  --foreground         once healthy, stay until the server exits, with its exit status (a Slurm
                       step lasts as long as its server)
  --dry-run            print what would run, start nothing
  -h, --help           this help
  -- ARGS...           further arguments for the vLLM server itself (e.g. -- --dtype float32)

Runs in the background and returns once healthy (with --foreground: when the server exits); the
server's PID is written to FILE.pid. A port still in use is waited for \$PORT_WAIT seconds (default
60), then refused; a server that does not come up, or a TERM/INT to this script, stops the
server's whole process tree.
USAGE
}

model="" gpus="" dp=1 port=8001 host=0.0.0.0 max_len=21504 timeout=1800 log=student_vllm.log
parse_server_args "$@"
[[ -n "$model" ]] || { usage >&2; die "--model is required" 2; }

# What TRL's client needs of the server, as `trl vllm-serve` sets it: dev mode (/server_info,
# /get_world_size, /reset_prefix_cache, the weight-update and /collective_rpc endpoints), log-probs
# after temperature (--logprobs-mode processed_logprobs) and as many as asked (--max-logprobs -1),
# the endpoints for images (--enable-scale-out).
if ((cpu)); then
    use_vllm_cpu
    # The reload extension comes from this repository, which the server's environment need not
    # have installed. vLLM for CPUs is 0.30 or later: it has --enable-scale-out.
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
    cmd=(env VLLM_SERVER_DEV_MODE=1 "${vllm_serve[@]}" --model "$model" --host "$host" --port "$port"
         --max-model-len "$max_len" --worker-extension-cls zppo_trl.vllm_worker.SharedMemoryWeightReload
         --enable-scale-out --logprobs-mode processed_logprobs --max-logprobs -1 "${extra[@]+"${extra[@]}"}")
else
    # Tensor parallel 1 as in the paper; each data-parallel replica is an engine of its own on one
    # GPU, and TRL's trainer joins their NCCL group as one rank more.
    vllm_scale_out
    cmd=(env VLLM_SERVER_DEV_MODE=1 vllm serve "$model" --host "$host" --port "$port" --tensor-parallel-size 1
         --data-parallel-size "$dp" --max-model-len "$max_len" "${scale_out[@]+"${scale_out[@]}"}"
         --weight-transfer-config '{"backend":"nccl"}' --logprobs-mode processed_logprobs --max-logprobs -1
         "${extra[@]+"${extra[@]}"}")
fi
start_server "student vLLM server" "http://127.0.0.1:$port/health" "$log" "${cmd[@]}"
