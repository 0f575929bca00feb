#!/usr/bin/env bash
# Serve the student's rollouts with TRL's vLLM server (`trl vllm-serve`), the server that
# `use_vllm: true, vllm_mode: server` talks to, then wait until it answers /health/.
# With --cpu, vLLM's own server on its CPU engine (`make vllm-env`) with what TRL's client needs
# and the shared-memory weight reload (vllm_weight_transfer: shm, zppo_trl/vllm_worker.py).
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
  --dry-run            print what would run, start nothing
  -h, --help           this help
  -- ARGS...           further arguments for the vLLM server itself (e.g. -- --dtype float32)

Runs in the background and returns once healthy; the server's PID is written to FILE.pid.
USAGE
}

model="" gpus="" dp=1 port=8001 host=0.0.0.0 max_len=21504 timeout=1800 log=student_vllm.log
parse_server_args "$@"
[[ -n "$model" ]] || { usage >&2; die "--model is required" 2; }

if ((cpu)); then
    use_vllm_cpu
    # What `trl vllm-serve` would set, less the NCCL engine: dev mode (/collective_rpc,
    # /server_info), log-probs after temperature, every log-prob on request; the reload extension
    # comes from this repository, which the server's environment need not have installed.
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    export VLLM_SERVER_DEV_MODE=1 PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
    cmd=("$python" -m vllm.entrypoints.openai.api_server --model "$model" --host "$host" --port "$port"
         --max-model-len "$max_len" --worker-extension-cls zppo_trl.vllm_worker.SharedMemoryWeightReload
         --logprobs-mode processed_logprobs --max-logprobs -1 "${extra[@]+"${extra[@]}"}")
    start_server "student vLLM server" "http://127.0.0.1:$port/health" "$log" "${cmd[@]}"
else
    cmd=(trl vllm-serve --model "$model" --tensor-parallel-size 1 --data-parallel-size "$dp"
         --host "$host" --port "$port" --max-model-len "$max_len" "${extra[@]+"${extra[@]}"}")
    start_server "student vLLM server" "http://127.0.0.1:$port/health/" "$log" "${cmd[@]}"
fi
