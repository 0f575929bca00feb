#!/usr/bin/env bash
# One node: start the student's vLLM server and the teacher's server on their own GPUs,
# wait until both answer, then train on the remaining GPUs. Servers started here are
# stopped however training ends. Multi-node runs: slurm_zppo.sbatch.
#
#   recipes/launch/train.sh --config recipes/qwen35_0.8b.yaml [-- --any_recipe_field value ...]
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

usage() {
    cat <<USAGE
usage: train.sh --config YAML [options] [-- recipe overrides]

  --config YAML           recipe, e.g. recipes/qwen35_0.8b.yaml
  --train-gpus LIST       GPUs for training ranks (default: 0,1,2,3)
  --student-gpus LIST     GPUs for the student's vLLM server (default: 4,5)
  --teacher-gpus LIST     GPUs for the teacher's vLLM server (default: 6,7); "none" to use
                          a running teacher (--teacher-url)
  --teacher-url URL       teacher base URL when it runs elsewhere (e.g. http://host:8000/v1)
  --teacher-model MODEL   teacher checkpoint (default: Qwen/Qwen3.5-27B-FP8)
  --accelerate-config F   default: recipes/accelerate_configs/zero2.yaml
  --dry-run               print what would run, start nothing
  -h, --help              this help

Everything after "--" goes to recipes/zppo.py (e.g. -- --max_steps 40 --output_dir runs/x).
With fewer training ranks than the recipe's num_training_ranks, each update holds fewer
new prompts (the script prints the composition before training).
USAGE
}

count() {
    local -a parts
    IFS=, read -ra parts <<<"$1"
    echo "${#parts[@]}"
}

config="" train_gpus=0,1,2,3 student_gpus=4,5 teacher_gpus=6,7 teacher_url="" teacher_model=Qwen/Qwen3.5-27B-FP8
accel=recipes/accelerate_configs/zero2.yaml
overrides=()
while (($#)); do
    case $1 in
        --config) need_value "$1" "${2:-}"; config=$2; shift 2 ;;
        --train-gpus) need_value "$1" "${2:-}"; train_gpus=$2; shift 2 ;;
        --student-gpus) need_value "$1" "${2:-}"; student_gpus=$2; shift 2 ;;
        --teacher-gpus) need_value "$1" "${2:-}"; teacher_gpus=$2; shift 2 ;;
        --teacher-url) need_value "$1" "${2:-}"; teacher_url=$2; shift 2 ;;
        --teacher-model) need_value "$1" "${2:-}"; teacher_model=$2; shift 2 ;;
        --accelerate-config) need_value "$1" "${2:-}"; accel=$2; shift 2 ;;
        --dry-run) export DRY_RUN=1; shift ;;
        -h | --help) usage; exit 0 ;;
        --) shift; overrides=("$@"); break ;;
        *) usage >&2; die "unknown option '$1'" 2 ;;
    esac
done
[[ -n "$config" ]] || { usage >&2; die "--config is required" 2; }
[[ -f "$config" ]] || die "--config $config: no such file" 2
[[ -f "$accel" ]] || die "--accelerate-config $accel: no such file" 2
if [[ "$teacher_gpus" == none && -z "$teacher_url" ]]; then die "--teacher-gpus none needs --teacher-url" 2; fi
student_model=$(recipe_field "$config" model_name_or_path)
[[ -n "$student_model" ]] || die "$config has no model_name_or_path" 2

# Both servers' contexts from the recipe's own lengths (a BCQ/NCQ prompt is longer than a plain one).
lengths=$(server_lengths "$config" "${overrides[@]}")
read -r student_len teacher_len <<<"$lengths"
echo "server context from $config: student $student_len tokens, teacher $teacher_len tokens"

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

here=$(dirname "${BASH_SOURCE[0]}")
logs=${LOG_DIR:-logs}
mkdir -p "$logs"
bash "$here/serve_student.sh" --model "$student_model" --gpus "$student_gpus" \
    --data-parallel "$(count "$student_gpus")" --port 8001 --max-model-len "$student_len" --log "$logs/student_vllm.log"
[[ "${DRY_RUN:-0}" == 1 ]] || pids+=("$(cat "$logs/student_vllm.log.pid")")
if [[ "$teacher_gpus" != none ]]; then
    bash "$here/serve_teacher.sh" --model "$teacher_model" --gpus "$teacher_gpus" \
        --data-parallel "$(count "$teacher_gpus")" --port 8000 --max-model-len "$teacher_len" --log "$logs/teacher_vllm.log"
    [[ "${DRY_RUN:-0}" == 1 ]] || pids+=("$(cat "$logs/teacher_vllm.log.pid")")
    teacher_url=http://127.0.0.1:8000/v1
fi

export CUDA_VISIBLE_DEVICES=$train_gpus
run accelerate launch --config_file "$accel" --num_processes "$(count "$train_gpus")" \
    recipes/zppo.py --config "$config" \
    --vllm_server_host 127.0.0.1 --vllm_server_port 8001 --vllm_max_model_length "$student_len" \
    --teacher_base_url "$teacher_url" --teacher_model "$teacher_model" "${overrides[@]}"
