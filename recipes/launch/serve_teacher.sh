#!/usr/bin/env bash
# Serve the frozen teacher (and judge) with `vllm serve` on an OpenAI-compatible endpoint,
# then wait until it answers /health. The recipes point teacher_base_url at http://HOST:PORT/v1.
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
  --dry-run            print what would run, start nothing
  -h, --help           this help

The API key, if any, is read from \$TEACHER_API_KEY (never passed on the command line).
Runs in the background and returns once healthy; the server's PID is written to FILE.pid.
USAGE
}

model=Qwen/Qwen3.5-27B-FP8 gpus="" dp=1 port=8000 host=0.0.0.0 max_len=19456 timeout=1800 log=teacher_vllm.log
parse_server_args "$@"

# vLLM reads VLLM_API_KEY itself, so the key never appears in `ps`.
if [[ -n "${TEACHER_API_KEY:-}" ]]; then export VLLM_API_KEY=$TEACHER_API_KEY; fi
cmd=(vllm serve "$model" --host "$host" --port "$port" --tensor-parallel-size 1
     --data-parallel-size "$dp" --max-model-len "$max_len")
start_server "teacher vLLM server" "http://127.0.0.1:$port/health" "$log" "${cmd[@]}"
