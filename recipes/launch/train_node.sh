#!/usr/bin/env bash
# One training node's part of a multi-node run: `slurm_zppo.sbatch` runs it once on each training
# node (one Slurm task per node; SLURM_PROCID is the node's machine rank).
#
#   train_node.sh ACCELERATE_CONFIG|cpu MACHINES PROCESSES HEAD PORT GPUS STATUS_DIR SCRIPT [ARGS...]
#
# - A node other than the first waits for the rendezvous at HEAD:PORT to answer, up to
#   RENDEZVOUS_TIMEOUT seconds (default 600, torch's own), and otherwise stops naming the address:
#   torch's static rendezvous would retry without a word for as long. torch's own rendezvous gets
#   30 s more, so that the node that cannot reach it is the one that reports.
# - `cpu` for ACCELERATE_CONFIG: CPU ranks on gloo (no config file; CPU_THREADS threads each,
#   default all cores / ranks on the node); GPUS is then empty.
# - Stop signals (USR1, TERM) reach the ranks, which finish their rollout step and checkpoint
#   (zppo_trl.preemption); accelerate's launcher ignores them.
# - It writes STATUS_DIR/NODE.status ("NODE MACHINE_RANK STATUS") when the ranks end. STATUS is
#   "stopped" for ranks that ended after a stop signal (they exit 75 at a checkpoint, which
#   torchrun reports as a failure, 1), and the script then exits 0: Slurm's --kill-on-bad-exit
#   must not end the other nodes while they write their part of the checkpoint. STATUS is "terminated" from the moment Slurm ends the step
#   (SIGTERM, then SIGKILL KillWait seconds later) until the ranks exit. A node whose processes were
#   killed writes nothing, which is how the launch script names it.
set -uo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
    sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
(($# >= 8)) || die "usage: train_node.sh ACCELERATE_CONFIG|cpu MACHINES PROCESSES HEAD PORT GPUS STATUS_DIR SCRIPT [ARGS...]" 2
accel=$1 machines=$2 processes=$3 head=$4 port=$5 gpus=$6 status_dir=$7
shift 7
rank=${SLURM_PROCID:-${MACHINE_RANK:?set SLURM_PROCID or MACHINE_RANK}}
node=${SLURMD_NODENAME:-$(hostname)}
timeout=${RENDEZVOUS_TIMEOUT:-600}
need_int RENDEZVOUS_TIMEOUT "$timeout"
signalled=0
trap 'signalled=1' USR1
# torchrun takes over TERM unless told (--signals-to-handle, read from PET_SIGNALS_TO_HANDLE; older torch reads
# TORCHELASTIC_SIGNALS_TO_HANDLE) and would end its ranks 30 s later, mid-checkpoint.
export PET_SIGNALS_TO_HANDLE=SIGINT,SIGHUP,SIGQUIT TORCHELASTIC_SIGNALS_TO_HANDLE=SIGINT,SIGHUP,SIGQUIT
mkdir -p "$status_dir"

# reachable HOST PORT: a TCP connection to HOST:PORT opens (bash's /dev/tcp).
reachable() { timeout 3 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }

if ((rank > 0)) && [[ "${DRY_RUN:-0}" != 1 ]]; then
    deadline=$((SECONDS + timeout))
    until reachable "$head" "$port"; do
        if ((SECONDS >= deadline)); then
            address=$(getent hosts "$head" | awk '{print $1}')
            echo "$node $rank unreachable-rendezvous" >"$status_dir/$node.status"
            die "training node $node (machine rank $rank) could not reach the rendezvous at $head:$port (${address:-no address for $head}) within ${timeout}s (RENDEZVOUS_TIMEOUT): the first training node never started its launcher there, or $node cannot route to it"
        fi
        sleep 2
    done
    echo "training node $node (machine rank $rank): rendezvous at $head:$port answers"
fi

launch=(accelerate launch --num_machines "$machines" --num_processes "$processes" --machine_rank "$rank"
    --main_process_ip "$head" --main_process_port "$port" --rdzv_conf "timeout=$((timeout + 30))")
if [[ "$accel" == cpu ]]; then
    per_node=$((processes / machines))
    threads=${CPU_THREADS:-$(($(nproc) / per_node > 0 ? $(nproc) / per_node : 1))}
    export CUDA_VISIBLE_DEVICES=""
    launch+=(--mixed_precision no --dynamo_backend no --num_cpu_threads_per_process "$threads")
    # accelerate's torchrun launcher, with the recipe's use_cpu: true: MULTI_CPU on gloo (it takes 2 ranks or more)
    if ((processes > 1)); then launch+=(--multi_gpu); fi
else
    export CUDA_VISIBLE_DEVICES=$gpus
    launch+=(--config_file "$accel")
fi
show "${launch[@]}" "$@"
[[ "${DRY_RUN:-0}" != 1 ]] || exit 0
# The launcher ignores USR1 and TERM (inherited, and not taken over: above); each rank handles both.
(
    trap "" USR1 TERM
    exec "${launch[@]}" "$@"
) &
ranks_pid=$!
# shellcheck disable=SC2329 # invoked by the trap below
terminated() { echo "$node $rank terminated" >"$status_dir/$node.status"; }
trap terminated TERM
status=0
wait "$ranks_pid" || status=$?
while kill -0 "$ranks_pid" 2>/dev/null; do # a trapped signal ends `wait` early: wait for the ranks themselves
    status=0
    wait "$ranks_pid" || status=$?
done
if ((status == 75 || (signalled && status != 0))); then # stopped at a checkpoint (75 through torchrun: 1)
    echo "$node $rank stopped" >"$status_dir/$node.status"
    echo "training node $node (machine rank $rank): ranks stopped after the stop signal (status $status)"
    exit 0
fi
echo "$node $rank $status" >"$status_dir/$node.status"
echo "training node $node (machine rank $rank): ranks exited with status $status"
exit "$status"
