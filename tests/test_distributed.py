"""`ZPPOTrainer` in 2 CPU processes (gloo) under `accelerate launch`: every decision is replicated.

The run is launched once per module by :func:`_launch` (``tests/distributed_worker.py``
does the training and writes one JSON per rank); the tests compare the ranks' records.

GRPO† setting: 3 new questions per rank (|X_new| = 6 over both ranks), replay fraction 0.5,
so up to 3 replays per step, which two ranks split 2 + 1: rank 1 scores a *filler* group,
and a partition where rank 1 has fewer rows is padded with zero-weight rows.

ZPPO setting (the boxed student and a real teacher server, which samples and compresses):
at most 3 BCQ/NCQ instances per step, dealt 2 + 1, so rank 1 scores a filler in the
reformulated round too.

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
import yaml
from boxed_models import toy_rows

from zppo_trl.data import write_jsonl

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "distributed_worker.py"
WORLD = 2
LAUNCH_TIMEOUT = 300
G = 4
REPLAY_FRACTION = 0.5
STEPS_PER_ROLLOUT = 3  # num_partitions x gradient_accumulation_steps in the worker


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(home: Path) -> dict:
    return dict(
        os.environ,
        OMP_NUM_THREADS="1",  # 2 processes on 2 cores
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(home),  # no user accelerate config file can change the launch
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )


def _accelerate(script: Path, script_args: list[str], env: dict, timeout: float) -> tuple[int | None, str]:
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
        str(_free_port()),
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


def _launch(outdir: Path, worker_args: list[str]) -> list[dict]:
    """Run the worker on 2 processes; the ranks' records, in rank order."""
    env = _env(outdir / "hf-home")
    code, output = _accelerate(WORKER, [str(outdir), *worker_args], env, LAUNCH_TIMEOUT)
    if code is None:
        pytest.fail(f"2-process run did not finish in {LAUNCH_TIMEOUT}s:\n{output[-6000:]}")
    if code != 0:
        pytest.fail(f"2-process run failed (exit {code}):\n{output[-6000:]}")
    return [json.loads((outdir / f"rank{r}.json").read_text()) for r in range(WORLD)]


def _rows(micro: dict):
    return "skip" if micro["skip"] else micro["rows"]


def _groups(record: dict, step: int, round_: int = 0) -> list[list]:
    rounds = record["rollout_steps"][step]["rounds"]
    return rounds[round_] if round_ < len(rounds) else []


# ---------------------------------------------------------------------- GRPO† (no teacher)


@pytest.fixture(scope="class")
def grpo_run(tiny_text_model_dir, tmp_path_factory) -> list[dict]:
    outdir = tmp_path_factory.mktemp("distributed-grpo")
    return _launch(outdir, [str(tiny_text_model_dir), "--mode", "grpo", "--max-steps", str(3 * STEPS_PER_ROLLOUT)])


class TestGRPORun:
    """Everything read off one two-process GRPO† run (a class: one pytest-xdist worker runs all of it)."""

    def test_two_gloo_processes(self, grpo_run):
        assert [r["rank"] for r in grpo_run] == [0, 1]
        assert all(
            r["world"] == WORLD and r["backend"] == "gloo" and r["distributed_type"] == "DistributedType.MULTI_CPU"
            for r in grpo_run
        )
        assert all(len(r["rollout_steps"]) == 3 and len(r["micro_steps"]) == 3 * STEPS_PER_ROLLOUT for r in grpo_run)

    def test_replicated_state_is_identical(self, grpo_run):
        rank0, rank1 = grpo_run
        assert rank0["residents"] and rank0["residents"] == rank1["residents"]
        assert rank0["counters"] == rank1["counters"]
        assert rank0["counters"]["rollout_steps"] == 3
        assert rank0["rng"] == rank1["rng"]
        for s0, s1 in zip(rank0["rollout_steps"], rank1["rollout_steps"]):
            assert s0["buffer_before"] == s1["buffer_before"]
            assert s0["metrics"] == s1["metrics"]  # every ZPPO metric of every step (timings left out)
        assert rank0["log_history"] == rank1["log_history"]

    def test_equal_rows_per_rank_at_every_micro_step(self, grpo_run):
        rank0, rank1 = grpo_run
        for s0, s1 in zip(rank0["rollout_steps"], rank1["rollout_steps"]):
            # every scoring round: the same number of groups on both ranks
            assert [len(r) for r in s0["rounds"]] == [len(r) for r in s1["rounds"]]
            assert [_rows(m) for m in s0["micro_batches"]] == [_rows(m) for m in s1["micro_batches"]]
            # TRL's token-mean divisor of a partition is the partition's token count over both ranks
            assert [m.get("num_items_in_batch") for m in s0["micro_batches"]] == [
                m.get("num_items_in_batch") for m in s1["micro_batches"]
            ]
        # what the training loop consumed, micro-step by micro-step
        assert [_rows(m) for m in rank0["micro_steps"]] == [_rows(m) for m in rank1["micro_steps"]]
        for record in grpo_run:
            assert record["micro_steps"] == [m for s in record["rollout_steps"] for m in s["micro_batches"]]

    def test_odd_replay_split_uses_a_filler_and_padding(self, grpo_run):
        fillers = padding = odd = 0
        for step in range(3):
            replay = [[key for kind, key, _ in _groups(r, step) if kind == "replay"] for r in grpo_run]
            count = len(replay[0]) + len(replay[1])
            assert len(set(replay[0]) | set(replay[1])) == count, "a resident replayed twice in one step"
            assert len(replay[0]) - len(replay[1]) in (0, 1), "replays are dealt round-robin, rank 0 first"
            rank_fillers = [sum(kind == "filler" for kind, _, _ in _groups(r, step)) for r in grpo_run]
            assert rank_fillers == [0, count % 2], "a rank short of a replay group scores exactly one filler"
            odd += count % 2
            fillers += sum(rank_fillers)
            padding += sum(m.get("padding", 0) for r in grpo_run for m in r["rollout_steps"][step]["micro_batches"])
        assert odd and fillers, "no step replayed an odd number of residents: the uneven split was not exercised"
        assert padding, "no partition was padded with zero-weight rows"
        # fillers are never trained: padding rows carry no loss tokens, and real rows are at most the non-filler groups
        for record in grpo_run:
            for step in record["rollout_steps"]:
                real = sum(m["rows"] - m["padding"] for m in step["micro_batches"] if not m["skip"])
                assert real <= G * sum(kind != "filler" for kind, _, _ in step["rounds"][0])

    def test_replayed_count_over_both_ranks(self, grpo_run):
        rank0 = grpo_run[0]
        logged = [h for h in rank0["log_history"] if "zppo/replayed" in h]
        assert len(logged) == 3
        for step, log in enumerate(logged):
            new = sum(kind == "new" for r in grpo_run for kind, _, _ in _groups(r, step))
            assert new == 2 * 3 and log["zppo/new"] == new  # |X_new| counted over both ranks
            buffer = rank0["rollout_steps"][step]["buffer_before"]
            expected = min(int(REPLAY_FRACTION * new), len(buffer))
            assert log["zppo/replayed"] == expected
            replayed = [key for r in grpo_run for kind, key, _ in _groups(r, step) if kind == "replay"]
            assert len(replayed) == expected and set(replayed) <= set(buffer)
        assert any(log["zppo/replayed"] for log in logged)

    def test_parameters_identical_and_skips_change_nothing(self, grpo_run):
        rank0, rank1 = grpo_run
        assert rank0["initial_params"] == rank1["initial_params"]
        assert rank0["params_after_step"] == rank1["params_after_step"]
        assert rank0["final_params"] == rank1["final_params"] != rank0["initial_params"]
        before = [rank0["initial_params"], *rank0["params_after_step"][:-1]]
        for micro, b, a in zip(rank0["micro_steps"], before, rank0["params_after_step"]):
            assert (a == b) == micro["skip"], (
                "an optimizer step must change the parameters exactly when its partition has signal"
            )

    # ---------------------------------------------------------------------- ZPPO (BCQ/NCQ, teacher server)


@pytest.fixture(scope="module", params=["trainer", "student-server"])
def zppo_run(request, boxed_text_student_dir, boxed_teacher_server, tmp_path_factory) -> list[dict]:
    """ZPPO on 2 ranks, the rollouts generated in the trainer or on one student vLLM server both ranks share."""
    outdir = tmp_path_factory.mktemp(f"distributed-zppo-{request.param}")
    args = [str(boxed_text_student_dir), "--mode", "zppo", "--max-steps", str(3 * STEPS_PER_ROLLOUT)]
    args += ["--teacher-url", boxed_teacher_server.base_url, "--teacher-model", boxed_teacher_server.model]
    if request.param == "student-server":
        args += ["--student-url", request.getfixturevalue("vllm_boxed_student_server").root_url]
    records = _launch(outdir, args)
    expected = "SharedMemoryVLLMClient" if request.param == "student-server" else "NoneType"
    assert [r["student_client"] for r in records] == [expected, "NoneType"]  # only the main process connects
    return records


def test_zppo_decisions_identical_and_reformulations_dealt_over_ranks(zppo_run):
    rank0, rank1 = zppo_run
    assert rank0["residents"] == rank1["residents"]
    assert rank0["counters"] == rank1["counters"] and rank0["rng"] == rank1["rng"]
    assert rank0["log_history"] == rank1["log_history"]
    assert rank0["params_after_step"] == rank1["params_after_step"]
    assert rank0["final_params"] == rank1["final_params"] != rank0["initial_params"]
    assert [_rows(m) for m in rank0["micro_steps"]] == [_rows(m) for m in rank1["micro_steps"]]
    on_rank = [0, 0]
    trained = odd = dropped_before = 0
    for step, (s0, s1) in enumerate(zip(rank0["rollout_steps"], rank1["rollout_steps"])):
        assert s0["metrics"] == s1["metrics"]  # plans, caps, buffer events, in-prompt accuracies
        assert [len(r) for r in s0["rounds"]] == [len(r) for r in s1["rounds"]], "both ranks score equal row counts"
        assert [_rows(m) for m in s0["micro_batches"]] == [_rows(m) for m in s1["micro_batches"]]
        reform = [_groups(r, step, 1) for r in zppo_run]
        for groups in reform:
            assert all(has_block == (kind != "filler") for kind, _, has_block in groups), (
                "only BCQ/NCQ prompts carry a block"
            )
        per_rank = [sum(kind in ("bcq", "ncq") for kind, _, _ in groups) for groups in reform]
        fillers = [sum(kind == "filler" for kind, _, _ in groups) for groups in reform]
        assert fillers == [max(per_rank) - n for n in per_rank]
        planned = s0["metrics"]["bcq"] + s0["metrics"]["ncq"]
        dropped = s0["metrics"]["dropped"]
        assert s0["metrics"]["dropped_total"] - dropped_before == dropped
        dropped_before += dropped
        assert sum(per_rank) == planned - dropped, "every planned instance is trained unless its compression failed"
        if not dropped:
            assert per_rank == [(planned + 1) // 2, planned // 2], "instances are dealt round-robin, rank 0 first"
        for kind in ("bcq", "ncq"):
            assert s0["metrics"][f"{kind}_trained"] == sum(k == kind for groups in reform for k, _, _ in groups)
        on_rank = [a + b for a, b in zip(on_rank, per_rank)]
        trained += sum(per_rank)
        odd += planned % 2
    assert trained >= 2 and all(on_rank), f"BCQ/NCQ groups must be dealt to both ranks, got {on_rank} per rank"
    assert odd, "no step planned an odd number of BCQ/NCQ instances: the uneven deal was not exercised"


# ---------------------------------------------------------------------- rows that train without RL


@pytest.fixture(scope="module", params=["correction", "on-distill"])
def row_run(
    request, boxed_text_student_dir, boxed_text_teacher_dir, boxed_teacher_server, tmp_path_factory
) -> list[dict]:
    outdir = tmp_path_factory.mktemp(f"distributed-{request.param}")
    args = [str(boxed_text_student_dir), "--mode", request.param, "--max-steps", str(2 * STEPS_PER_ROLLOUT)]
    args += [
        "--teacher-url",
        boxed_teacher_server.base_url,
        "--teacher-model",
        boxed_teacher_server.model,
        "--distill-teacher",
        str(boxed_text_teacher_dir),
    ]
    return _launch(outdir, args)


def test_supervised_and_distillation_rows_step_alike_on_both_ranks(row_run):
    """Correction-SFT's targets and On-Distill's rollouts are dealt over ranks, padded to equal rows, and
    every rank takes the same partitions, skips and optimizer steps."""
    rank0, rank1 = row_run
    assert rank0["residents"] == rank1["residents"]
    assert rank0["counters"] == rank1["counters"] and rank0["rng"] == rank1["rng"]
    assert rank0["log_history"] == rank1["log_history"]
    assert [_rows(m) for m in rank0["micro_steps"]] == [_rows(m) for m in rank1["micro_steps"]]
    assert rank0["params_after_step"] == rank1["params_after_step"]
    assert rank0["final_params"] == rank1["final_params"] != rank0["initial_params"]
    trained = [log["zppo/targets_trained"] for log in rank0["log_history"] if "zppo/targets_trained" in log]
    assert trained and sum(trained) > 0


def test_a_two_process_recipe_run_saves_and_exits_cleanly(tiny_text_model_dir, tmp_path):
    # recipes/zppo.py as a user launches it on 2 gloo processes (GRPO†: no teacher), three times: each run saves
    # and every rank exits 0. Freeing the trainer after destroying the process group hung a rank after its last
    # line in about one run in two (zppo_trl.recipe.release_distributed), so three runs catch a regression
    # seven times in eight.
    data = tmp_path / "toy.jsonl"
    write_jsonl(toy_rows("text"), data)
    settings = {
        "model_name_or_path": str(tiny_text_model_dir), "dataset_name": str(data), "augmentations": [],
        "use_judge": False, "use_cpu": True, "bf16": False, "use_vllm": False, "gradient_checkpointing": False,
        "report_to": [], "num_generations": 4, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
        "num_partitions": 2, "max_completion_length": 8, "replay_fraction": 0.5, "max_steps": 2,
        "save_strategy": "no", "logging_steps": 1, "seed": 0, "disable_tqdm": True,
    }  # fmt: skip
    for run in range(3):
        out = tmp_path / f"run{run}"
        config = tmp_path / f"run{run}.yaml"
        config.write_text(yaml.safe_dump({**settings, "output_dir": str(out)}))
        code, output = _accelerate(
            REPO_ROOT / "recipes" / "zppo.py", ["--config", str(config)], _env(tmp_path / "hf-home"), 240
        )
        assert code is not None, f"run {run}: a rank did not exit:\n{output[-3000:]}"
        assert code == 0, f"run {run} failed (exit {code}):\n{output[-3000:]}"
        assert f"done: {out}" in output
        assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()
