#!/usr/bin/env bash
# One training node's part of a multi-node run: `slurm_zppo.sbatch` runs it once on each training
# node (one Slurm task per node; SLURM_PROCID is the node's machine rank).
#
#   train_node.sh ACCELERATE_CONFIG|cpu MACHINES PROCESSES HEAD PORT GPUS STATUS_DIR SCRIPT [ARGS...]
#
# - A node other than the first waits for the rendezvous at HEAD:PORT to answer, up to
#   RENDEZVOUS_TIMEOUT seconds (default 600, torch's own), and otherwise stops naming the address:
#   torch's static rendezvous would retry without a word for as long.
# - `cpu` for ACCELERATE_CONFIG: CPU ranks on gloo (no config file; CPU_THREADS threads each,
#   default all cores / ranks on the node); GPUS is then empty.
# - Stop signals (USR1, TERM) reach the ranks, which finish their rollout step and checkpoint
#   (zppo_trl.preemption); this script and accelerate's launcher ignore them.
# - It writes STATUS_DIR/NODE.status ("NODE MACHINE_RANK STATUS") when the ranks end, and exits 0
#   for a run stopped at a checkpoint (75): Slurm's --kill-on-bad-exit must not end the other
#   nodes while they write theirs. A node whose processes were killed writes nothing, which is how
#   the launch script names it.
set -uo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

(($# >= 8)) || die "usage: train_node.sh ACCELERATE_CONFIG|cpu MACHINES PROCESSES HEAD PORT GPUS STATUS_DIR SCRIPT [ARGS...]" 2
accel=$1 machines=$2 processes=$3 head=$4 port=$5 gpus=$6 status_dir=$7
shift 7
rank=${SLURM_PROCID:-${MACHINE_RANK:?set SLURM_PROCID or MACHINE_RANK}}
node=${SLURMD_NODENAME:-$(hostname)}
timeout=${RENDEZVOUS_TIMEOUT:-600}
need_int RENDEZVOUS_TIMEOUT "$timeout"
trap "" USR1 TERM
export TORCHELASTIC_SIGNALS_TO_HANDLE=SIGINT,SIGHUP,SIGQUIT

# reachable HOST PORT: a TCP connection to HOST:PORT opens (bash's /dev/tcp).
reachable() { timeout 3 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }

if ((rank > 0)) && [[ "${DRY_RUN:-0}" != 1 ]]; then
    deadline=$((SECONDS + timeout))
    until reachable "$head" "$port"; do
        if ((SECONDS >= deadline)); then
            address=$(getent hosts "$head" | awk '{print $1}')
            die "training node $node (machine rank $rank) could not reach the rendezvous at $head:$port (${address:-no address for $head}) within ${timeout}s (RENDEZVOUS_TIMEOUT): the first training node never started its launcher there, or $node cannot route to it"
        fi
        sleep 2
    done
    echo "training node $node (machine rank $rank): rendezvous at $head:$port answers"
fi

launch=(accelerate launch --num_machines "$machines" --num_processes "$processes" --machine_rank "$rank"
    --main_process_ip "$head" --main_process_port "$port" --rdzv_conf "timeout=$timeout")
if [[ "$accel" == cpu ]]; then
    per_node=$((processes / machines))
    threads=${CPU_THREADS:-$(($(nproc) / per_node > 0 ? $(nproc) / per_node : 1))}
    export CUDA_VISIBLE_DEVICES=""
    # accelerate's torchrun launcher, with the recipe's use_cpu: true: MULTI_CPU on gloo
    launch+=(--multi_gpu --mixed_precision no --dynamo_backend no --num_cpu_threads_per_process "$threads")
else
    export CUDA_VISIBLE_DEVICES=$gpus
    launch+=(--config_file "$accel")
fi
status=0
run "${launch[@]}" "$@" || status=$?
[[ "${DRY_RUN:-0}" == 1 ]] && exit 0
mkdir -p "$status_dir"
echo "$node $rank $status" >"$status_dir/$node.status"
echo "training node $node (machine rank $rank): ranks exited with status $status"
if ((status == 75)); then exit 0; fi # stopped at a checkpoint: the launch script reads it from the status file
exit "$status"
