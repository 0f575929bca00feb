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
  --max-model-len N    context (default: 32768: a 12,288-token reply inside the compression prompt)
  --timeout S          seconds to wait for health (default: 1800)
  --log FILE           server log (default: teacher_vllm.log)
  --dry-run            print what would run, start nothing
  -h, --help           this help

The API key, if any, is read from \$TEACHER_API_KEY (never passed on the command line).
Runs in the background and returns once healthy; the server's PID is written to FILE.pid.
USAGE
}

model=Qwen/Qwen3.5-27B-FP8 gpus="" dp=1 port=8000 host=0.0.0.0 max_len=32768 timeout=1800 log=teacher_vllm.log
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

if [[ -n "$gpus" ]]; then export CUDA_VISIBLE_DEVICES=$gpus; fi
# vLLM reads VLLM_API_KEY itself, so the key never appears in `ps`.
if [[ -n "${TEACHER_API_KEY:-}" ]]; then export VLLM_API_KEY=$TEACHER_API_KEY; fi
cmd=(vllm serve "$model" --host "$host" --port "$port" --tensor-parallel-size 1
     --data-parallel-size "$dp" --max-model-len "$max_len")
echo "teacher vLLM server on GPUs ${gpus:-all}, log: $log"
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    run "${cmd[@]}"
    pid=""
else
    run "${cmd[@]}" >"$log" 2>&1 &
    pid=$!
    echo "$pid" >"$log.pid"
fi
wait_for_http "http://127.0.0.1:$port/health" "$timeout" "teacher vLLM server" "$pid"
