#!/usr/bin/env bash
# The CPU demo, end to end: materialize SmolLM2-135M-Instruct, serve it as the teacher and as
# the student's rollout server with vLLM's CPU engine on 127.0.0.1 (production's topology: a
# student server that takes the trainer's weights after every update, here through /dev/shm,
# and a teacher server), train with ZPPO (recipes/demo.yaml), plot the run. The servers are
# stopped however the run ends. `make demo` creates both environments and calls this; run it
# directly with PYTHON=path/to/python (the trainer's) and VLLM_PYTHON=path/to/python (vLLM's,
# from `make vllm-env`). TEACHER=transformers serves the teacher with `transformers serve`
# instead; STUDENT=transformers generates the rollouts in the trainer instead. PRECISION=bf16|fp32 sets
# the trainer's and both servers' precision (default: zppo_trl/cpu_precision.py's decision, bf16 only where it
# pays on this CPU). DRY_RUN=1 prints the precision and the commands and starts nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=../launch/common.sh
source recipes/launch/common.sh

PYTHON=${PYTHON:-.venv/bin/python}
MODEL_DIR=${MODEL_DIR:-.cache/demo/SmolLM2-135M-Instruct}
PORT=${PORT:-8765}
STUDENT_PORT=${STUDENT_PORT:-8766}
TEACHER=${TEACHER:-vllm}
STUDENT=${STUDENT:-vllm}
# The trainer's and the servers' precision, decided once (zppo_trl/cpu_precision.py): the paper trains in bf16, but
# on a CPU bf16 pays only where the CPU computes it natively; elsewhere every bf16 matmul is converted through float32
# (38x slower than float32 for one of the demo model's matmuls on an AVX2-only CPU). The servers sample in bf16 on
# AMX or AVX-512 BF16, the trainer's autocast (a cast of every weight at every matmul) only on AMX.
# auto: that decision; bf16 or fp32 sets both.
PRECISION=${PRECISION:-auto}
VLLM_PYTHON=${VLLM_PYTHON:-.venv-vllm/bin/python}
RUNS=${RUNS:-outputs/demo}
# Every demo is a fresh run in a folder of its own; earlier runs are kept (about 2 GB each,
# mostly the final checkpoint's optimizer state). OUT names the folder; it must not exist.
OUT=${OUT:-$RUNS/$(date +%Y%m%d-%H%M%S)}
BIN=$(dirname "$PYTHON")
if [[ -e "$OUT" && "${DRY_RUN:-0}" != 1 ]]; then
    echo "error: $OUT already exists; the demo never writes over a run. Leave OUT unset (each run gets a new folder under $RUNS) or pick another." >&2
    exit 2
fi
case $TEACHER in
    vllm) [[ -x "$VLLM_PYTHON" ]] || die "no vLLM at $VLLM_PYTHON: run \`make vllm-env\` (or TEACHER=transformers)" 2 ;;
    transformers) ;;
    *) die "TEACHER must be vllm or transformers, got '$TEACHER'" 2 ;;
esac
case $PRECISION in
    auto|bf16|fp32) ;;
    *) die "PRECISION must be auto, bf16 or fp32, got '$PRECISION'" 2 ;;
esac
case $STUDENT in
    vllm) [[ -x "$VLLM_PYTHON" ]] || die "no vLLM at $VLLM_PYTHON: run \`make vllm-env\` (or STUDENT=transformers)" 2 ;;
    transformers) ;;
    *) die "STUDENT must be vllm or transformers, got '$STUDENT'" 2 ;;
esac

start=$(date +%s)
read -r PRECISION dtype cpu_class <<<"$("$PYTHON" zppo_trl/cpu_precision.py --precision "$PRECISION" --cpuinfo "${CPUINFO:-/proc/cpuinfo}")"
bf16=false
if [[ $PRECISION == bf16 ]]; then bf16=true; fi
echo "precision: $PRECISION for the trainer, --dtype $dtype for both vLLM servers (CPU class $cpu_class; PRECISION=auto|bf16|fp32 chooses)"
if [[ "${DRY_RUN:-0}" != 1 ]]; then "$PYTHON" recipes/demo/prepare_model.py "$MODEL_DIR"; fi

if [[ "${DRY_RUN:-0}" != 1 ]]; then
    mkdir -p "$OUT"
    ln -sfn "$(basename "$OUT")" "$RUNS/latest" 2>/dev/null || true  # outputs/demo/latest: the newest run
fi
echo "this run: $OUT (earlier runs stay in $RUNS)"
stop_servers() {  # SIGTERM (vLLM stops its engine processes), SIGKILL after 30 s
    local pid_file pid
    for pid_file in "$OUT"/*_server.log.pid; do
        [[ -f "$pid_file" ]] || continue
        pid=$(cat "$pid_file")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -9 "$pid" 2>/dev/null || true
        echo "$(basename "$pid_file" _server.log.pid) server stopped"
    done
}
trap stop_servers EXIT
# The servers' contexts fit the recipe's longest requests (recipes/zppo.py --print_server_lengths).
# The precision above, and eager mode (it starts in about 16 s instead of about 55 s, for 7% less throughput).
read -r student_len teacher_len <<<"$(PYTHON=$PYTHON server_lengths recipes/demo.yaml)"
# vLLM binds each server to the first core unless told otherwise: the teacher keeps it and the student's server
# takes the last. The teacher samples a step's questions while the student generates its plain rollouts, on the
# other core, with the trainer waiting (recipes/demo.yaml: prefetch_teacher_samples false), so that the trainer's
# updates have every core to themselves.
teacher_cores=() student_cores=()
if (( $(nproc) > 1 )); then teacher_cores=(--cpu-cores 0) student_cores=(--cpu-cores "$(( $(nproc) - 1 ))"); fi
# KV-cache blocks of 32 tokens instead of the CPU engine's 128: the 4 rollouts of a prompt share its full blocks
# (vLLM's prefix cache), and the demo's prompts run to 100-400 tokens. One plain round's 4 x 4 x 48 tokens on one
# core (benchmarks/bench_cpu_server.py): 13.83 s against 21.74 s on 2 cores of an AVX2-only AMD EPYC.
block=(--block-size 32)
# The two vLLM servers start side by side (about 35 s each on an AMX Xeon), and the trainer
# starts once both answer.
starting=()
if [[ "$TEACHER" == vllm ]]; then
    echo "teacher: vLLM (CPU) serving $MODEL_DIR on 127.0.0.1:$PORT (log: $OUT/teacher_server.log)"
    VLLM_PYTHON=$VLLM_PYTHON bash recipes/launch/serve_teacher.sh --cpu --model "$MODEL_DIR" --host 127.0.0.1 --port "$PORT" \
        --max-model-len "$teacher_len" --kv-cache-gib 1 "${teacher_cores[@]+"${teacher_cores[@]}"}" --timeout 300 --log "$OUT/teacher_server.log" \
        -- --dtype "$dtype" --enforce-eager "${block[@]}" &
    starting+=($!)
else
    echo "teacher: transformers serve $MODEL_DIR on 127.0.0.1:$PORT (log: $OUT/teacher_server.log)"
    # One thread for the server: the trainer needs the other core, and a tiny model oversubscribes.
    # No --continuous-batching: it applies the first request's sampling settings to every later
    # request, so the teacher's near-greedy samples and its compressions could not both be right.
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        show "$BIN/transformers" serve "$MODEL_DIR" --host 127.0.0.1 --port "$PORT" --device cpu
    else
        OMP_NUM_THREADS=1 "$BIN/transformers" serve "$MODEL_DIR" --host 127.0.0.1 --port "$PORT" --device cpu \
            >"$OUT/teacher_server.log" 2>&1 &
        echo $! >"$OUT/teacher_server.log.pid"
    fi
fi
student=()
if [[ "$STUDENT" == vllm ]]; then
    echo "student rollouts: vLLM (CPU) serving $MODEL_DIR on 127.0.0.1:$STUDENT_PORT, weights synced through /dev/shm (log: $OUT/student_server.log)"
    VLLM_PYTHON=$VLLM_PYTHON bash recipes/launch/serve_student.sh --cpu --model "$MODEL_DIR" --host 127.0.0.1 \
        --port "$STUDENT_PORT" --max-model-len "$student_len" --kv-cache-gib 1 "${student_cores[@]+"${student_cores[@]}"}" --timeout 300 \
        --log "$OUT/student_server.log" -- --dtype "$dtype" --enforce-eager "${block[@]}" &
    starting+=($!)
    student=(--use_vllm true --vllm_mode server --vllm_server_base_url "http://127.0.0.1:$STUDENT_PORT"
             --vllm_max_model_length "$student_len")
else
    echo "student rollouts: generated in the trainer (transformers)"
fi
for job in "${starting[@]+"${starting[@]}"}"; do wait "$job"; done  # a server that fails to start ends the demo
trap 'exit 130' INT TERM

# accelerate gives a CPU process one thread unless told (OMP_NUM_THREADS=1): the trainer takes every
# core, since the servers idle while it updates.
run "$BIN/accelerate" launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
    --num_cpu_threads_per_process "$(nproc)" \
    recipes/zppo.py --config recipes/demo.yaml --bf16 "$bf16" \
    --teacher_base_url "http://127.0.0.1:$PORT/v1" --teacher_model "$MODEL_DIR" \
    --model_name_or_path "$MODEL_DIR" --output_dir "$OUT" "${student[@]+"${student[@]}"}"
if [[ "${DRY_RUN:-0}" == 1 ]]; then exit 0; fi

"$PYTHON" recipes/demo/plot_run.py "$OUT"  # the figure, and the run's totals
echo "demo done in $(( $(date +%s) - start )) s: checkpoint, metrics.jsonl, TensorBoard events and the figure are in $OUT"
