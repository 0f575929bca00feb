#!/usr/bin/env bash
# Helpers shared by the launch scripts (sourced, not run).

# die MESSAGE [CODE]: print to stderr and exit (2 = usage error, 1 = runtime failure).
die() {
    echo "error: $1" >&2
    exit "${2:-1}"
}

# show CMD...: print the command as `+ cmd args...`, quoted for the shell.
show() {
    printf '+'
    printf ' %q' "$@"
    printf '\n'
}

# run CMD...: print the command; execute it unless DRY_RUN=1.
run() {
    show "$@"
    if [[ "${DRY_RUN:-0}" != 1 ]]; then
        "$@"
    fi
}

# need_value OPTION VALUE: fail with a usage error when an option lacks its value.
need_value() {
    [[ -n "${2:-}" && "${2:0:2}" != "--" ]] || die "$1 needs a value" 2
}

# need_int OPTION VALUE: fail with a usage error unless VALUE is a positive integer.
need_int() {
    [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'" 2
}

# wait_for_http URL TIMEOUT_S NAME [PID]: poll URL until it answers (HTTP < 400). Fails
# after TIMEOUT_S seconds, or at once when the server process PID has exited.
wait_for_http() {
    local url=$1 timeout=$2 name=$3 pid=${4:-}
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        echo "(dry run) would wait up to ${timeout}s for $name at $url"
        return 0
    fi
    local deadline=$((SECONDS + timeout))
    until curl -sf -o /dev/null --max-time 5 "$url"; do
        if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
            echo "error: $name exited before answering at $url" >&2
            return 1
        fi
        if ((SECONDS >= deadline)); then
            echo "error: $name did not answer at $url within ${timeout}s" >&2
            return 1
        fi
        sleep 5
    done
    echo "$name is up at $url"
}

# parse_server_args ARGS...: the options serve_student.sh and serve_teacher.sh share. Sets
# model gpus dp port host max_len timeout log (defaults set by the caller beforehand), cpu
# kv_cache_gib cpu_cores (vLLM's CPU engine), foreground and extra (everything after `--`, for the
# server itself); calls the caller's `usage` for --help and on errors.
# shellcheck disable=SC2034  # the globals it sets are read by the sourcing script
parse_server_args() {
    cpu=0 kv_cache_gib=2 cpu_cores="" foreground=0 extra=()
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
            --cpu) cpu=1; shift ;;
            --kv-cache-gib) need_value "$1" "${2:-}"; need_int "$1" "$2"; kv_cache_gib=$2; shift 2 ;;
            --cpu-cores)
                need_value "$1" "${2:-}"
                [[ "$2" =~ ^[0-9]+([,-][0-9]+)*$ ]] || die "--cpu-cores must be a core list like 1 or 0-3,6, got '$2'" 2
                cpu_cores=$2; shift 2 ;;
            --foreground) foreground=1; shift ;;
            --dry-run) export DRY_RUN=1; shift ;;
            -h | --help) usage; exit 0 ;;
            --) shift; extra=("$@"); break ;;
            *) usage >&2; die "unknown option '$1'" 2 ;;
        esac
    done
    [[ -z "$cpu_cores" ]] || ((cpu)) || die "--cpu-cores applies with --cpu only" 2
}

# use_vllm_cpu: prepare vLLM's CPU engine (the servers' --cpu). Sets `vllm_serve` to the command
# that starts vLLM's OpenAI-compatible server with $VLLM_PYTHON (default .venv-vllm/bin/python,
# built by `make vllm-env`) and exports the engine's settings (its KV cache from $kv_cache_gib, its
# cores from $cpu_cores); refuses --gpus and --data-parallel, which do not apply.
# shellcheck disable=SC2034  # vllm_serve is read by the sourcing script
use_vllm_cpu() {
    local python=${VLLM_PYTHON:-.venv-vllm/bin/python}
    [[ "${DRY_RUN:-0}" == 1 || -x "$python" ]] || die "no vLLM for CPUs at $python: run \`make vllm-env\` (or set VLLM_PYTHON)" 2
    [[ -z "$gpus" && "$dp" == 1 ]] || die "--gpus and --data-parallel do not apply with --cpu" 2
    # Not `vllm serve`: the distribution is named vllm-cpu, and vLLM's CLI (`vllm`, `python -m
    # vllm.entrypoints.cli.main`, so `trl vllm-serve` too) reads the version of a distribution named
    # vllm while it builds its parser, for any subcommand, --help included: it exits with
    # PackageNotFoundError (vllm-cpu 0.32.0). Nor `python -m vllm.entrypoints.openai.api_server`,
    # deprecated in 0.32 ("may be removed"): it only runs the module below, the server `vllm serve`
    # runs with one API process, which takes the same arguments (--model MODEL, not a positional).
    vllm_serve=("$python" -m vllm.entrypoints.launchers.api_server.entry)
    # On CPUs vLLM otherwise reserves 92% of the NUMA node's memory for its KV cache and refuses
    # to start when other processes hold some of it.
    export VLLM_CPU_KVCACHE_SPACE=${kv_cache_gib:-2} VLLM_NO_USAGE_STATS=1 CUDA_VISIBLE_DEVICES=""
    # vLLM binds its engine's threads to the first core by default: two servers on one machine
    # would share it while the other cores idle.
    if [[ -n "${cpu_cores:-}" ]]; then export VLLM_CPU_OMP_THREADS_BIND=$cpu_cores; fi
    # The engine's precision, where the caller gives none: bf16 only where the CPU computes it natively, AMX or
    # AVX-512 BF16 (zppo_trl/cpu_precision.py; PRECISION=bf16|fp32 to choose): vLLM's CPU default is bf16 on any CPU.
    local arg
    for arg in "${extra[@]+"${extra[@]}"}"; do [[ "$arg" == --dtype* ]] && return 0; done
    local py=$python
    [[ -x "$py" ]] || py=python3
    local decided
    decided=$("$py" "$(dirname "${BASH_SOURCE[0]}")/../../zppo_trl/cpu_precision.py" --cpuinfo "${CPUINFO:-/proc/cpuinfo}") \
        || die "cannot decide the server's precision (PRECISION must be auto, bf16 or fp32)" 2
    read -r _ cpu_dtype cpu_class <<<"$decided"
    echo "vLLM CPU engine: --dtype $cpu_dtype (CPU class $cpu_class)"
    extra+=(--dtype "$cpu_dtype")
}

# vllm_scale_out: sets `scale_out` to --enable-scale-out, which TRL's client needs from vLLM 0.30 on
# for images (/v1/chat/completions/render, /inference/v1/generate), as `trl vllm-serve` adds it;
# empty where the vLLM that ${PYTHON:-python} imports is older (it has no such flag). Where that
# Python has no vLLM (a dry run elsewhere), the flag: TRL 1.16's newest vLLM, 0.31, has it.
# shellcheck disable=SC2034  # scale_out is read by the sourcing script
vllm_scale_out() {
    local older
    older=$("${PYTHON:-python}" -c 'import importlib.metadata as m, re
print(int(tuple(int(n) for n in re.findall(r"[0-9]+", m.version("vllm"))[:2]) < (0, 30)))' 2>/dev/null) || older=0
    if [[ "$older" == 1 ]]; then scale_out=(); else scale_out=(--enable-scale-out); fi
}

# process_tree PID: PID and every process descended from it, parents first.
process_tree() {
    local children child
    echo "$1"
    children=$(cat /proc/"$1"/task/*/children 2>/dev/null) || true
    for child in $children; do process_tree "$child"; done
}

# stop_tree PID...: SIGTERM to those processes, SIGKILL to any still there 10 s later.
stop_tree() {
    kill -TERM "$@" 2>/dev/null || true
    local _ pid alive
    for _ in $(seq 20); do
        alive=0
        for pid in "$@"; do if kill -0 "$pid" 2>/dev/null; then alive=1; break; fi; done
        ((alive)) || return 0
        sleep 0.5
    done
    kill -KILL "$@" 2>/dev/null || true
}

# port_free HEALTH_URL NAME: wait up to PORT_WAIT seconds (default 60) for nothing to listen on
# HEALTH_URL's host and port (a server an earlier job left there, shutting down), then fail naming
# it: a new server could not bind it, and its health check would be answered by the old one.
port_free() {
    local address=${1#*://}
    address=${address%%/*}
    local host=${address%:*} port=${address##*:} waited=0
    while (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; do
        if ((waited >= ${PORT_WAIT:-60})); then
            echo "error: $2 cannot start: something on $(hostname) still listens on port $port after ${waited}s (PORT_WAIT; a server an earlier job left running?)" >&2
            return 1
        fi
        sleep 5
        waited=$((waited + 5))
    done
}

# start_server NAME HEALTH_URL LOG CMD...: run CMD in the background on $gpus (or the CPU
# where the caller set cpu=1; logging to LOG, PID in LOG.pid) and wait for HEALTH_URL; with
# DRY_RUN=1 only print it. Fails at once where HEALTH_URL's port is taken (port_free). Where the
# caller set foreground=1, then wait for the server itself and return its exit status: a Slurm step
# (or any supervisor) lasts as long as its server, since Slurm ends a step's every process when its
# first one exits. A server that does not come up is stopped before this fails, and a TERM, INT or
# HUP while it starts (in the foreground: while it runs) stops its whole process tree before the
# script exits: no part of it outlives the script. (A process whose parent died is invisible to
# Slurm's process tracking by parent PID, proctrack/linuxproc, and would hold its port for good.)
start_server() {
    local name=$1 health=$2 log=$3
    shift 3
    if [[ "${DRY_RUN:-0}" != 1 ]]; then port_free "$health" "$name" || return 1; fi
    if [[ -n "${gpus:-}" ]]; then export CUDA_VISIBLE_DEVICES=$gpus; fi
    if [[ "${cpu:-0}" == 1 ]]; then
        echo "$name on the CPU, log: $log"
    else
        echo "$name on GPUs ${gpus:-all}, log: $log"
    fi
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        run "$@"
        wait_for_http "$health" "${timeout:-1800}" "$name"
        return
    fi
    show "$@"
    # Started directly, not through `run`: $! must be the server's own PID (a function in the
    # background is a subshell, and killing that would leave the server running).
    "$@" >"$log" 2>&1 &
    local pid=$!
    echo "$pid" >"$log.pid"
    # shellcheck disable=SC2064 # this server's PID, now
    trap "stop_tree \$(process_tree $pid); exit 143" TERM INT HUP
    if ! wait_for_http "$health" "${timeout:-1800}" "$name" "$pid"; then
        # shellcheck disable=SC2046 # one PID per word
        stop_tree $(process_tree "$pid")
        return 1
    fi
    if [[ "${foreground:-0}" != 1 ]]; then
        trap - TERM INT HUP # up: the caller stops it (LOG.pid)
        return 0
    fi
    local status=0
    wait "$pid" || status=$?
    echo "$name exited (status $status)"
    return "$status"
}

# recipe_field CONFIG NAME: NAME's value in a recipe YAML, else in the base: recipe it builds on
# (recipes/rows/ name the scale recipe as their base).
recipe_field() {
    local config=$1 name=$2 value base
    while [[ -f "$config" ]]; do
        value=$(sed -n "s/^$name: *\([^ #]*\).*/\1/p" "$config")
        [[ -n "$value" ]] && { echo "$value"; return 0; }
        base=$(sed -n 's/^base: *\([^ #]*\).*/\1/p' "$config")
        [[ -n "$base" ]] || return 1
        config="$(dirname "$config")/$base"
    done
    return 1
}

# server_lengths CONFIG [RECIPE OVERRIDES...]: "STUDENT TEACHER", the --max-model-len of the
# student's and the teacher's servers for that recipe (its own prompt, block and completion
# lengths). A recipe or override that does not parse stops the launch here, before any server.
server_lengths() {
    local out
    if ! out=$("${PYTHON:-python}" recipes/zppo.py --config "$@" --print_server_lengths 2>&1); then
        printf '%s\n' "$out" | tail -n 3 >&2
        die "cannot size the servers from $1 and its overrides (see above)"
    fi
    out=$(printf '%s\n' "$out" | tail -n 1)
    [[ "$out" =~ ^[0-9]+\ [0-9]+$ ]] || die "cannot size the servers from $1 (got '$out')"
    echo "$out"
}
