#!/usr/bin/env bash
# Serve the frozen teacher (and judge) with `vllm serve` on an OpenAI-compatible endpoint,
# then wait until it answers /health. The recipes point teacher_base_url at http://HOST:PORT/v1.
# With --cpu, the same server runs on vLLM's CPU engine from the environment that
# install_vllm_cpu.sh builds (`make vllm-env`): the demo's and the tests' teacher. The teacher
# needs nothing beyond the OpenAI API (chat completions): no dev mode, no weight transfer.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
    cat <<USAGE
usage: serve_teacher.sh [options]

  --model MODEL        teacher checkpoint (default: Qwen/Qwen3.5-27B-FP8)
  --gpus LIST          CUDA_VISIBLE_DEVICES for the server (default: all visible)
  --data-parallel N    replicas, one per GPU: tensor parallel 1, as in the paper (default: 1)
  --port PORT          HTTP port (default: 8000)
  --host HOST          bind address (default: 0.0.0.0)
  --max-model-len N    context (default: 19456, the paper's recipes: the judge reading a 12,288-token
                       response under a 4,096-token question; train.sh and the Slurm script size it
                       from your recipe: python recipes/zppo.py --config YAML --print_server_lengths)
  --timeout S          seconds to wait for health (default: 1800)
  --log FILE           server log (default: teacher_vllm.log)
  --cpu                vLLM's CPU engine instead of GPUs: \$VLLM_PYTHON (default .venv-vllm/bin/python,
                       built by \`make vllm-env\`) runs the server; --gpus and --data-parallel do not apply
  --kv-cache-gib N     with --cpu: KV-cache memory in GiB (default: 2)
  --cpu-cores LIST     with --cpu: the cores vLLM binds its engine to, e.g. 1 or 0-3 (default: vLLM's
                       choice, the first core: give a second server on the machine other cores)
  --foreground         once healthy, stay until the server exits, with its exit status (a Slurm
                       step lasts as long as its server)
  --dry-run            print what would run, start nothing
  -h, --help           this help
  -- ARGS...           further arguments for the vLLM server itself (e.g. -- --dtype bfloat16)

The API key, if any, is read from \$TEACHER_API_KEY (never passed on the command line).
Runs in the background and returns once healthy (with --foreground: when the server exits); the
server's PID is written to FILE.pid. A port still in use is waited for \$PORT_WAIT seconds (default
60), then refused; a server that does not come up, or a TERM/INT to this script, stops the
server's whole process tree.
USAGE
}

model=Qwen/Qwen3.5-27B-FP8 gpus="" dp=1 port=8000 host=0.0.0.0 max_len=19456 timeout=1800 log=teacher_vllm.log
parse_server_args "$@"

# vLLM reads VLLM_API_KEY itself, so the key never appears in `ps`.
if [[ -n "${TEACHER_API_KEY:-}" ]]; then export VLLM_API_KEY=$TEACHER_API_KEY; fi
if ((cpu)); then
    use_vllm_cpu
    cmd=("${vllm_serve[@]}" --model "$model" --host "$host" --port "$port" --max-model-len "$max_len"
         "${extra[@]+"${extra[@]}"}")
    start_server "teacher vLLM server" "http://127.0.0.1:$port/health" "$log" "${cmd[@]}"
else
    cmd=(vllm serve "$model" --host "$host" --port "$port" --tensor-parallel-size 1
         --data-parallel-size "$dp" --max-model-len "$max_len" "${extra[@]+"${extra[@]}"}")
    start_server "teacher vLLM server" "http://127.0.0.1:$port/health" "$log" "${cmd[@]}"
fi
