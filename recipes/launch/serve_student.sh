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
  --max-model-len N    context length (default: 16384 = 4,096 prompt + 12,288 completion)
  --timeout S          seconds to wait for health (default: 1800)
  --log FILE           server log (default: student_vllm.log)
  --dry-run            print what would run, start nothing
  -h, --help           this help

Runs in the background and returns once healthy; the server's PID is written to FILE.pid.
USAGE
}

model="" gpus="" dp=1 port=8001 host=0.0.0.0 max_len=16384 timeout=1800 log=student_vllm.log
while (($#)); do
    case $1 in
        --model) need_value "$1" "${2:-}"; model=$2; shift 2 ;;
        --gpus) need_value "$1" "${2:-}"; gpus=$2; shift 2 ;;
        --data-parallel) need_value "$1" "${2:-}"; need_int "$1" "$2"; dp=$2; shift 2 ;;
        --port) need_value "$1" "${2:-}"; need_int "$1" "$2"; port=$2; shift 2 ;;
        --host) need_value "$1" "${2:-}"; host=$2; shift 2 ;;
        --max-model-len) need_value "$1" "${2:-}"; need_int "$1" "$2"; max_len=$2; shift 2 ;;
        --timeout) need_value "$1" "${2:-}"; need_int "$1" "$2"; timeout=$2; shift 2 ;;
        --log) need_value "$1" "${2:-}"; log=$2; shift 2 ;;
        --dry-run) export DRY_RUN=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown option '$1'" 2 ;;
    esac
done
[[ -n "$model" ]] || { usage >&2; die "--model is required" 2; }

if [[ -n "$gpus" ]]; then export CUDA_VISIBLE_DEVICES=$gpus; fi
cmd=(trl vllm-serve --model "$model" --tensor-parallel-size 1 --data-parallel-size "$dp"
     --host "$host" --port "$port" --max-model-len "$max_len")
echo "student vLLM server on GPUs ${gpus:-all}, log: $log"
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    run "${cmd[@]}"
    pid=""
else
    run "${cmd[@]}" >"$log" 2>&1 &
    pid=$!
    echo "$pid" >"$log.pid"
fi
wait_for_http "http://127.0.0.1:$port/health/" "$timeout" "student vLLM server" "$pid"
