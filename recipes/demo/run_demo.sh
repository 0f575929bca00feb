#!/usr/bin/env bash
# The CPU demo, end to end: materialize SmolLM2-135M-Instruct, serve it as the teacher with
# vLLM's CPU engine on 127.0.0.1 (as production serves the teacher, on GPUs), train with ZPPO
# (recipes/demo.yaml), plot the run. The teacher server is stopped however the run ends.
# `make demo` creates both environments and calls this; run it directly with
# PYTHON=path/to/python (the trainer's) and VLLM_PYTHON=path/to/python (vLLM's, from
# `make vllm-env`). TEACHER=transformers serves the teacher with `transformers serve` instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=../launch/common.sh
source recipes/launch/common.sh

PYTHON=${PYTHON:-.venv/bin/python}
MODEL_DIR=${MODEL_DIR:-.cache/demo/SmolLM2-135M-Instruct}
PORT=${PORT:-8765}
TEACHER=${TEACHER:-vllm}
VLLM_PYTHON=${VLLM_PYTHON:-.venv-vllm/bin/python}
RUNS=${RUNS:-outputs/demo}
# Every demo is a fresh run in a folder of its own; earlier runs are kept (about 2 GB each,
# mostly the final checkpoint's optimizer state). OUT names the folder; it must not exist.
OUT=${OUT:-$RUNS/$(date +%Y%m%d-%H%M%S)}
BIN=$(dirname "$PYTHON")
if [[ -e "$OUT" ]]; then
    echo "error: $OUT already exists; the demo never writes over a run. Leave OUT unset (each run gets a new folder under $RUNS) or pick another." >&2
    exit 2
fi
case $TEACHER in
    vllm) [[ -x "$VLLM_PYTHON" ]] || die "no vLLM at $VLLM_PYTHON: run \`make vllm-env\` (or TEACHER=transformers)" 2 ;;
    transformers) ;;
    *) die "TEACHER must be vllm or transformers, got '$TEACHER'" 2 ;;
esac

start=$(date +%s)
"$PYTHON" recipes/demo/prepare_model.py "$MODEL_DIR"

mkdir -p "$OUT"
ln -sfn "$(basename "$OUT")" "$RUNS/latest" 2>/dev/null || true  # outputs/demo/latest: the newest run
echo "this run: $OUT (earlier runs stay in $RUNS)"
server=""
stop_server() {  # SIGTERM (vLLM stops its engine processes), SIGKILL after 30 s
    if [[ -z "$server" && -f "$OUT/teacher_server.log.pid" ]]; then server=$(cat "$OUT/teacher_server.log.pid"); fi
    if [[ -n "$server" ]]; then
        kill "$server" 2>/dev/null || true
        for _ in $(seq 60); do kill -0 "$server" 2>/dev/null || break; sleep 0.5; done
        kill -9 "$server" 2>/dev/null || true
        echo "teacher server stopped"
    fi
}
if [[ "$TEACHER" == vllm ]]; then
    # The context fits the recipe's longest teacher request (recipes/zppo.py --print_server_lengths).
    # bfloat16 (about 1.6x float32's throughput on CPUs with AVX512-BF16) and eager mode (it
    # starts in about 16 s instead of about 55 s, for 7% less throughput).
    read -r _ teacher_len <<<"$(PYTHON=$PYTHON server_lengths recipes/demo.yaml)"
    echo "teacher: vLLM (CPU) serving $MODEL_DIR on 127.0.0.1:$PORT (log: $OUT/teacher_server.log)"
    trap stop_server EXIT
    VLLM_PYTHON=$VLLM_PYTHON bash recipes/launch/serve_teacher.sh --cpu --model "$MODEL_DIR" --host 127.0.0.1 --port "$PORT" \
        --max-model-len "$teacher_len" --kv-cache-gib 1 --timeout 300 --log "$OUT/teacher_server.log" \
        -- --dtype bfloat16 --enforce-eager
    server=$(cat "$OUT/teacher_server.log.pid")
else
    echo "teacher: transformers serve $MODEL_DIR on 127.0.0.1:$PORT (log: $OUT/teacher_server.log)"
    # One thread for the server: the trainer needs the other core, and a tiny model oversubscribes.
    # No --continuous-batching: it applies the first request's sampling settings to every later
    # request, so the teacher's near-greedy samples and its compressions could not both be right.
    OMP_NUM_THREADS=1 "$BIN/transformers" serve "$MODEL_DIR" --host 127.0.0.1 --port "$PORT" --device cpu \
        >"$OUT/teacher_server.log" 2>&1 &
    server=$!
    trap stop_server EXIT
fi
trap 'exit 130' INT TERM

"$BIN/accelerate" launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
    recipes/zppo.py --config recipes/demo.yaml \
    --teacher_base_url "http://127.0.0.1:$PORT/v1" --teacher_model "$MODEL_DIR" \
    --model_name_or_path "$MODEL_DIR" --output_dir "$OUT"

"$PYTHON" recipes/demo/plot_run.py "$OUT"  # the figure, and the run's totals
echo "demo done in $(( $(date +%s) - start )) s: checkpoint, metrics.jsonl, TensorBoard events and the figure are in $OUT"
