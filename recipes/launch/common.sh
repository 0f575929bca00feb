#!/usr/bin/env bash
# Helpers shared by the launch scripts (sourced, not run).

# die MESSAGE [CODE]: print to stderr and exit (2 = usage error, 1 = runtime failure).
die() {
    echo "error: $1" >&2
    exit "${2:-1}"
}

# run CMD...: print the command; execute it unless DRY_RUN=1.
run() {
    printf '+'
    printf ' %q' "$@"
    printf '\n'
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
