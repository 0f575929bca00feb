#!/usr/bin/env bash
# Serve the student's rollouts with TRL's vLLM server (`trl vllm-serve`), the server that
# `use_vllm: true, vllm_mode: server` talks to, then wait until it answers /health/.
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
  --dry-run            print what would run, start nothing
  -h, --help           this help

Runs in the background and returns once healthy; the server's PID is written to FILE.pid.
USAGE
}

model="" gpus="" dp=1 port=8001 host=0.0.0.0 max_len=21504 timeout=1800 log=student_vllm.log
parse_server_args "$@"
[[ -n "$model" ]] || { usage >&2; die "--model is required" 2; }

cmd=(trl vllm-serve --model "$model" --tensor-parallel-size 1 --data-parallel-size "$dp"
     --host "$host" --port "$port" --max-model-len "$max_len")
start_server "student vLLM server" "http://127.0.0.1:$port/health/" "$log" "${cmd[@]}"
