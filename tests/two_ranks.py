"""Two-process ZPPO runs (gloo, CPU) under `accelerate launch`, for the tests that compare the ranks' records.

:func:`launch` starts ``tests/distributed_worker.py`` on two processes with a list of runs, which the two
processes train one after the other: a launch costs each rank about ten seconds of a core in imports alone, so a
module launches once for all of its runs. :func:`accelerate` is the launch itself (``recipes/zppo.py`` is launched
with it too); :func:`check_zppo_run` is what every ZPPO run on two ranks must show, wherever its rollouts come from.

Launching: ``accelerate launch --cpu`` starts a single process unless an MPI hostfile is
given, so the worker is launched with ``--multi_gpu`` (accelerate's torchrun launcher) and
its config sets ``use_cpu=True``: accelerate then runs MULTI_CPU with the gloo backend.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "distributed_worker.py"
WORLD = 2
# per run in a launch (each trains for 10 to 60 s on 2 busy cores)
RUN_TIMEOUT = 150
STEPS_PER_ROLLOUT = 3  # num_partitions x gradient_accumulation_steps in the worker


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def environment(home: Path) -> dict:
    """The launch's environment: one thread per rank, offline, no GPU, no user accelerate config."""
    return dict(
        os.environ,
        OMP_NUM_THREADS="1",  # 2 processes on 2 cores
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(home),  # no user accelerate config file can change the launch
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )


def accelerate(script: Path, script_args: list[str], env: dict, timeout: float) -> tuple[int | None, str]:
    """``accelerate launch`` 2 processes of ``script``; (exit code, output). On timeout the whole
    process group (launcher, torchrun and both ranks) is killed and the exit code is None."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(WORLD)]
    command += [
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
    ]
    command += [str(script), *script_args]
    process = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return None, output


def launch(outdir: Path, runs: list[dict]) -> dict[str, list[dict]]:
    """Train ``runs`` (see ``distributed_worker.py``) one after the other on 2 processes; each run's ranks'
    records, in rank order, by run name."""
    outdir.mkdir(parents=True, exist_ok=True)
    spec = outdir / "runs.json"
    spec.write_text(json.dumps(runs, indent=1))
    timeout = RUN_TIMEOUT * len(runs)
    code, output = accelerate(WORKER, [str(outdir), str(spec)], environment(outdir / "hf-home"), timeout)
    names = [run["name"] for run in runs]
    if code is None:
        pytest.fail(f"2-process runs {names} did not finish in {timeout}s:\n{output[-6000:]}")
    if code != 0:
        pytest.fail(f"2-process runs {names} failed (exit {code}):\n{output[-6000:]}")
    return {name: [json.loads((outdir / name / f"rank{r}.json").read_text()) for r in range(WORLD)] for name in names}


def rows(micro: dict):
    """What a micro-batch trained: its row count, or "skip"."""
    return "skip" if micro["skip"] else micro["rows"]


def groups(record: dict, step: int, round_: int = 0) -> list[list]:
    """The ``[kind, key, has_block]`` groups ``record``'s rank scored in a round of a rollout step."""
    rounds = record["rollout_steps"][step]["rounds"]
    return rounds[round_] if round_ < len(rounds) else []


def check_zppo_run(run: list[dict]) -> None:
    """A ZPPO run (BCQ/NCQ against a teacher server) on two ranks: every decision replicated, the same parameters
    after every step, and the reformulated instances dealt round-robin (rank 0 first) over the ranks, the rank
    short of one scoring a filler."""
    rank0, rank1 = run
    assert rank0["residents"] == rank1["residents"]
    assert rank0["counters"] == rank1["counters"] and rank0["rng"] == rank1["rng"]
    assert rank0["log_history"] == rank1["log_history"]
    assert rank0["params_after_step"] == rank1["params_after_step"]
    assert rank0["final_params"] == rank1["final_params"] != rank0["initial_params"]
    assert [rows(m) for m in rank0["micro_steps"]] == [rows(m) for m in rank1["micro_steps"]]
    on_rank = [0, 0]
    trained = odd = dropped_before = 0
    for step, (s0, s1) in enumerate(zip(rank0["rollout_steps"], rank1["rollout_steps"])):
        assert s0["metrics"] == s1["metrics"]  # plans, caps, buffer events, in-prompt accuracies
        assert [len(r) for r in s0["rounds"]] == [len(r) for r in s1["rounds"]], "both ranks score equal row counts"
        assert [rows(m) for m in s0["micro_batches"]] == [rows(m) for m in s1["micro_batches"]]
        reform = [groups(r, step, 1) for r in run]
        for rank_groups in reform:
            assert all(has_block == (kind != "filler") for kind, _, has_block in rank_groups), (
                "only BCQ/NCQ prompts carry a block"
            )
        per_rank = [sum(kind in ("bcq", "ncq") for kind, _, _ in rank_groups) for rank_groups in reform]
        fillers = [sum(kind == "filler" for kind, _, _ in rank_groups) for rank_groups in reform]
        assert fillers == [max(per_rank) - n for n in per_rank]
        planned = s0["metrics"]["bcq"] + s0["metrics"]["ncq"]
        dropped = s0["metrics"]["dropped"]
        assert s0["metrics"]["dropped_total"] - dropped_before == dropped
        dropped_before += dropped
        assert sum(per_rank) == planned - dropped, "every planned instance is trained unless its compression failed"
        if not dropped:
            assert per_rank == [(planned + 1) // 2, planned // 2], "instances are dealt round-robin, rank 0 first"
        for kind in ("bcq", "ncq"):
            assert s0["metrics"][f"{kind}_trained"] == sum(
                k == kind for rank_groups in reform for k, _, _ in rank_groups
            )
        on_rank = [a + b for a, b in zip(on_rank, per_rank)]
        trained += sum(per_rank)
        odd += planned % 2
    assert trained >= 2 and all(on_rank), f"BCQ/NCQ groups must be dealt to both ranks, got {on_rank} per rank"
    assert odd, "no step planned an odd number of BCQ/NCQ instances: the uneven deal was not exercised"
