#!/usr/bin/env bash
# The CPU demo, end to end: materialize SmolLM2-135M-Instruct, serve it as the teacher with
# `transformers serve` on 127.0.0.1, train with ZPPO (recipes/demo.yaml), plot the run.
# The teacher server is stopped however the run ends. `make demo` creates the environment
# and calls this; run it directly with PYTHON=path/to/python.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-.venv/bin/python}
MODEL_DIR=${MODEL_DIR:-.cache/demo/SmolLM2-135M-Instruct}
PORT=${PORT:-8765}
RUNS=${RUNS:-outputs/demo}
# Every demo is a fresh run in a folder of its own; earlier runs are kept (about 2 GB each,
# mostly the final checkpoint's optimizer state). OUT names the folder; it must not exist.
OUT=${OUT:-$RUNS/$(date +%Y%m%d-%H%M%S)}
BIN=$(dirname "$PYTHON")
if [[ -e "$OUT" ]]; then
    echo "error: $OUT already exists; the demo never writes over a run. Leave OUT unset (each run gets a new folder under $RUNS) or pick another." >&2
    exit 2
fi

start=$(date +%s)
"$PYTHON" recipes/demo/prepare_model.py "$MODEL_DIR"

mkdir -p "$OUT"
ln -sfn "$(basename "$OUT")" "$RUNS/latest" 2>/dev/null || true  # outputs/demo/latest: the newest run
echo "this run: $OUT (earlier runs stay in $RUNS)"
echo "teacher: transformers serve $MODEL_DIR on 127.0.0.1:$PORT (log: $OUT/teacher_server.log)"
# One thread for the server: the trainer needs the other core, and a tiny model oversubscribes.
# No --continuous-batching: it applies the first request's sampling settings to every later
# request, so the teacher's near-greedy samples and its compressions could not both be right.
OMP_NUM_THREADS=1 "$BIN/transformers" serve "$MODEL_DIR" --host 127.0.0.1 --port "$PORT" --device cpu \
    >"$OUT/teacher_server.log" 2>&1 &
server=$!
stop_server() {
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    echo "teacher server stopped"
}
trap stop_server EXIT
trap 'exit 130' INT TERM

"$BIN/accelerate" launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
    recipes/zppo.py --config recipes/demo.yaml \
    --teacher_base_url "http://127.0.0.1:$PORT/v1" --teacher_model "$MODEL_DIR" \
    --model_name_or_path "$MODEL_DIR" --output_dir "$OUT"

"$PYTHON" recipes/demo/plot_run.py "$OUT"  # the figure, and the run's totals
echo "demo done in $(( $(date +%s) - start )) s: checkpoint, metrics.jsonl, TensorBoard events and the figure are in $OUT"
