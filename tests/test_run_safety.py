"""Runs that cannot collide, resume from half a checkpoint or train on verdicts never given.

One ``output_dir`` holds one run: a second is refused naming the first, a lock whose process is gone is taken
over. A trainer SIGKILLed in the middle of writing a checkpoint leaves it without TRL's trainer state: the resume
skips it, naming it, and goes on from the checkpoint before; a torn last line of ``metrics.jsonl`` is dropped;
``save_only_model`` checkpoints keep the ZPPO state. A judge that stops answering leaves the groups it could not
score out of the step, counted.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import warnings
import zlib
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.callbacks import JsonlMetricsCallback, read_metrics
from zppo_trl.checkpoint_state import ZPPO_STATE_NAME, last_complete_checkpoint
from zppo_trl.rewards import judged_accuracy_reward
from zppo_trl.run_lock import LOCK_NAME, RunLocked, release_job_lock, run_lock
from zppo_trl.storage_plan import checkpoint_size
from zppo_trl.teacher import TeacherClient

try:
    from servers import kill_after_first_rollout_step
except ImportError:  # tests/ imported as a package
    from tests.servers import kill_after_first_rollout_step

REPO = Path(__file__).resolve().parent.parent


def _write_lock(directory: Path, pid: int, host: str | None = None, **job) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    holder = {"host": host or socket.gethostname(), "pid": pid, "started": "2026-11-28 08:00:00 UTC", **job}
    (directory / LOCK_NAME).write_text(json.dumps(holder))


def test_a_second_run_is_refused_naming_the_first_and_a_stale_lock_is_taken_over(tmp_path, caplog):
    out = tmp_path / "out"
    with run_lock(str(out)):
        holder = json.loads((out / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(RunLocked, match=rf"in use by another run \(PID {os.getpid()} on {socket.gethostname()}"):
            with run_lock(str(out)):
                pass
    assert not (out / LOCK_NAME).exists()  # a finished run leaves none
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _write_lock(out, gone.pid)
    with caplog.at_level(logging.WARNING, logger="zppo_trl.run_lock"), run_lock(str(out)):
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert f"taking over the lock of a run that is gone (PID {gone.pid}" in caplog.text
    _write_lock(out, 1, host="another-node")
    with pytest.raises(RunLocked, match=rf"another-node.*if that run is over, remove {out / LOCK_NAME}"):
        with run_lock(str(out)):
            pass
    with run_lock(str(out), active=False):  # ranks other than the main process take no lock
        pass


def test_a_requeued_job_takes_over_its_own_lock_on_another_host_and_nothing_else(tmp_path, monkeypatch, caplog):
    out = tmp_path / "out"
    monkeypatch.delenv("ZPPO_JOB_ID", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    # the job's first incarnation, on a node this one cannot check: a job runs one incarnation at a time
    _write_lock(out, 1, host="node-07", job="4242", restart=0)
    with caplog.at_level(logging.WARNING, logger="zppo_trl.run_lock"), run_lock(str(out)):
        holder = json.loads((out / LOCK_NAME).read_text())
        assert (holder["job"], holder["restart"], holder["pid"]) == ("4242", 1, os.getpid())
    assert "PID 1 on node-07" in caplog.text and "an earlier incarnation of this job" in caplog.text
    assert not (out / LOCK_NAME).exists()
    # the same incarnation elsewhere (a second launch in one allocation) and another job's run are live: refused
    for job in (dict(job="4242", restart=1), dict(job="4243", restart=0), {}):
        _write_lock(out, 1, host="node-07", **job)
        with pytest.raises(RunLocked, match=r"in use by another run \(PID 1 on node-07"):
            with run_lock(str(out)):
                pass


def test_the_job_whose_node_died_releases_its_own_lock_and_no_other(tmp_path, monkeypatch):
    """A lost node leaves its run's lock; the job that launched the run (the Slurm script, once its training step has
    ended) removes it, so that a resubmission on other nodes takes the output_dir. Only this incarnation's lock."""
    out = tmp_path / "out"
    monkeypatch.delenv("ZPPO_JOB_ID", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    for job in (dict(job="4242", restart=0), dict(job="4243", restart=1), {}):  # another incarnation or job: kept
        _write_lock(out, 1, host="node-07", **job)
        assert release_job_lock(str(out)) is None and (out / LOCK_NAME).exists()
    _write_lock(out, 1, host="node-07", job="4242", restart=1)
    released = release_job_lock(str(out))
    assert released == "PID 1 on node-07, started 2026-11-28 08:00:00 UTC, job 4242 restart 1"
    assert not (out / LOCK_NAME).exists()
    assert release_job_lock(str(out)) is None  # gone: nothing to release


def test_a_torn_last_metrics_line_is_dropped_and_an_earlier_bad_line_named(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "loss": 0.')
    with caplog.at_level(logging.WARNING, logger="zppo_trl.appended_log"):
        assert read_metrics(path) == [{"step": 1}, {"step": 2}]
    assert f"{path}:3: dropped a torn last line" in caplog.text
    path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ValueError, match=rf"{path}:2: not a JSON line"):
        read_metrics(path)


# A training script SIGKILLed while it writes its second checkpoint: after the weights and ZPPO's state, before
# TRL's trainer state (which transformers writes last).
_KILLED_MID_SAVE = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, sys.argv[3])
    from test_run_safety import QUESTIONS, hashed_reward, settings
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from zppo_trl import ZPPOConfig, ZPPOTrainer
    from zppo_trl.callbacks import JsonlMetricsCallback

    class KilledMidSave(ZPPOTrainer):
        def _save_rng_state(self, output_dir):  # where the ZPPO state is written
            super()._save_rng_state(output_dir)
            if self.state.global_step == 4:
                os.kill(os.getpid(), signal.SIGKILL)

    model_dir, out = sys.argv[1], sys.argv[2]
    trainer = KilledMidSave(
        model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=hashed_reward,
        args=ZPPOConfig(**settings(out, max_steps=6)), train_dataset=Dataset.from_list(QUESTIONS),
        processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=[JsonlMetricsCallback()],
    )
    trainer.train()
    """
)

QUESTIONS = [
    dict(id=f"q{i:02d}", question=f"What is {i} + {i}?", images=[], answer=str(2 * i), source="toy", subdataset="sum")
    for i in range(24)
]


def hashed_reward(completions, id, **kwargs):
    """0/1 by a hash of the question and the completion: the same rollout scores alike in every process."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [float(zlib.crc32(f"{key}|{text}".encode()) % 3 == 0) for key, text in zip(id, texts)]


def settings(out, **overrides) -> dict:
    values = dict(
        output_dir=str(out), use_cpu=True, bf16=False, report_to=[], seed=0, data_seed=0, disable_tqdm=True,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=6, num_partitions=2,
        gradient_accumulation_steps=1, augmentations=[], replay_fraction=0.5, learning_rate=1e-2, logging_steps=1,
        save_strategy="steps", save_steps=2,
    )  # fmt: skip
    values.update(overrides)
    return values


@pytest.mark.integration
def test_a_run_killed_mid_save_resumes_from_the_last_whole_checkpoint(tiny_text_model_dir, tmp_path, caplog):
    out = tmp_path / "out"
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_MID_SAVE, str(tiny_text_model_dir), str(out), str(REPO / "tests")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (out / "checkpoint-4" / ZPPO_STATE_NAME).exists() and not (
        out / "checkpoint-4" / "trainer_state.json"
    ).exists()
    assert (out / LOCK_NAME).exists()  # the killed run's lock, left behind
    with open(out / "metrics.jsonl", "a") as f:  # and a line cut short, as a kill mid-write leaves it
        f.write('{"step": 5, "loss": 0.1')

    trainer = ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_text_model_dir),
        reward_funcs=hashed_reward,
        args=ZPPOConfig(**settings(out, max_steps=6, save_only_model=True)),
        train_dataset=Dataset.from_list(QUESTIONS),
        processing_class=AutoTokenizer.from_pretrained(tiny_text_model_dir),
        callbacks=[JsonlMetricsCallback()],
    )
    assert trainer.args.gradient_checkpointing  # TRL's default, whose calls transformers 5 deprecates
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert last_complete_checkpoint(str(out)) == str(out / "checkpoint-2")
        trainer.train(resume_from_checkpoint=True)
    # a quiet console: two rollout steps in library use raise no deprecation warning (zppo_trl.deprecations)
    deprecations = [
        f"{w.filename}:{w.lineno}: {w.message}"
        for w in caught
        if issubclass(w.category, (FutureWarning, DeprecationWarning))
    ]
    assert not deprecations, deprecations
    assert f"skipping {out / 'checkpoint-4'}: an incomplete checkpoint (no trainer_state.json)" in caplog.text
    assert "taking over the lock of a run that is gone" in caplog.text
    assert "dropped a torn last line" in caplog.text
    saved = json.loads((out / "checkpoint-2" / ZPPO_STATE_NAME).read_text())
    assert trainer.state.global_step == 6 and not (out / LOCK_NAME).exists()
    steps = [row["step"] for row in read_metrics(out / "metrics.jsonl") if "loss" in row]
    assert steps == [1, 2, 3, 4, 5, 6], steps  # the killed run's 1-2, then the resumed 3-6 (its 3-4 dropped)
    assert saved["buffer"]["residents"]  # the state the resume started from: hard questions admitted by step 2
    # the dry run's storage estimate against this whole checkpoint (float32 weights, AdamW's float32 moments):
    # weights and optimizer state within 3%, the ZPPO state under its bound
    parameters = sum(p.numel() for p in trainer.model.parameters())
    size = checkpoint_size(parameters, ZPPOConfig(**settings(out)), "float32")
    written = {name: (out / "checkpoint-2" / name).stat().st_size for name in ("model.safetensors", "optimizer.pt")}
    assert size.weights + size.optimizer == pytest.approx(sum(written.values()), rel=0.03), written
    assert (out / "checkpoint-2" / ZPPO_STATE_NAME).stat().st_size < size.state
    # save_only_model checkpoints keep the ZPPO state (buffer, counters) next to the weights
    state = json.loads((out / "checkpoint-6" / ZPPO_STATE_NAME).read_text())
    assert state["buffer"] == trainer.replay_buffer.state_dict()
    assert last_complete_checkpoint(str(out)) == str(out / "checkpoint-6")
    # resumed once more, at max_steps (a resubmission of a run killed after its last checkpoint): nothing left to
    # train, where transformers' loop would run one update more before it looks at max_steps
    done = _trainer(tiny_text_model_dir, out, max_steps=6, save_only_model=True)
    done.train(resume_from_checkpoint=True)
    assert done.state.global_step == 6 and not (out / "checkpoint-7").exists()
    for (name, a), b in zip(done.model.named_parameters(), trainer.model.parameters()):
        assert torch.equal(a, b), name
    assert [row["step"] for row in read_metrics(out / "metrics.jsonl") if "loss" in row] == steps


class SignalAtStepBegin(TrainerCallback):
    """SIGTERM to this process as optimizer step ``step`` begins: before its rollout step generates."""

    def __init__(self, step: int):
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step - 1:
            os.kill(os.getpid(), signal.SIGTERM)


def _trainer(model_dir, out, callbacks=(), **overrides) -> ZPPOTrainer:
    return ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=hashed_reward,
        args=ZPPOConfig(**settings(out, **overrides)), train_dataset=Dataset.from_list(QUESTIONS),
        processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=list(callbacks),
    )  # fmt: skip


def test_a_step_that_would_not_fit_the_grace_period_is_abandoned_and_its_start_resumes_as_the_straight_run(
    tiny_text_model_dir, tmp_path, caplog
):
    # SIGTERM as update 3 begins, before rollout step 2 generates, with a grace period no step fits: once the plain
    # round is scored the step is left, its start (step 2) checkpointed with the state the step started from
    straight = _trainer(tiny_text_model_dir, tmp_path / "straight", max_steps=6, save_strategy="no")
    straight.train()
    out = tmp_path / "out"
    stopped = _trainer(
        tiny_text_model_dir, out, [SignalAtStepBegin(3)], max_steps=6, save_steps=100, preemption_grace_seconds=0
    )
    with caplog.at_level(logging.WARNING, logger="zppo_trl.preemption"):
        stopped.train()
    assert stopped.preemption.preempted and stopped.preemption.stopped_at == 2 and stopped.state.global_step == 2
    assert "would not fit the grace period: leaving it at step 2" in caplog.text
    assert last_complete_checkpoint(str(out)) == str(out / "checkpoint-2") and not (out / LOCK_NAME).exists()
    # the resume from that boundary ends where the uninterrupted run ends: weights, buffer, counters, shared RNG
    resumed = _trainer(tiny_text_model_dir, out, max_steps=6, save_steps=100)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 6 and not resumed.preemption.preempted
    assert resumed.zppo_state.state_dict() == straight.zppo_state.state_dict()
    for (name, a), b in zip(resumed.model.named_parameters(), straight.model.parameters()):
        assert torch.equal(a, b), name


# A run whose output_dir is a 2.6 MB tmpfs: checkpoint-2 (about 1.6 MB with its optimizer state) fits, checkpoint-4
# does not. Run in a mount namespace of its own, so the tmpfs is the run's alone and gone with it.
_FULL_DISK = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, sys.argv[3])
    from test_run_safety import QUESTIONS, hashed_reward, settings
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from zppo_trl import ZPPOConfig, ZPPOTrainer
    from zppo_trl.checkpoint_state import CheckpointWriteError

    out, model_dir = sys.argv[1], sys.argv[2]
    trainer = ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=hashed_reward,
        args=ZPPOConfig(**settings(out, max_steps=4)), train_dataset=Dataset.from_list(QUESTIONS),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    try:
        trainer.train()
    except CheckpointWriteError as err:
        print("ERROR", err.errno, err)
    print("LEFT", sorted(os.listdir(out)))
    """
)


def test_a_full_disk_ends_the_run_with_one_error_naming_the_path_errno_and_last_whole_checkpoint(
    tiny_text_model_dir, tmp_path
):
    out = tmp_path / "out"
    out.mkdir()
    mounted = 'mount -t tmpfs -o size=2600k tmpfs "$0" && exec "$1" -c "$2" "$0" "$3" "$4"'
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mounted, str(out), sys.executable]
    probe = subprocess.run(["unshare", "--mount", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace with a tmpfs here (unshare: {probe.stderr.decode().strip()})")
    run = subprocess.run(
        [*command, _FULL_DISK, str(tiny_text_model_dir), str(REPO / "tests")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    error = next(line for line in run.stdout.splitlines() if line.startswith("ERROR"))
    assert error.startswith("ERROR 28 ") and f"checkpoint {out / 'checkpoint-4'} could not be written" in error
    assert "No space left on device (errno 28, ENOSPC)" in error and "MiB free on its filesystem" in error
    assert f"the last whole checkpoint is {out / 'checkpoint-2'}" in error and "run again to resume" in error
    left = next(line for line in run.stdout.splitlines() if line.startswith("LEFT"))
    assert "'checkpoint-2'" in left and "checkpoint-4" not in left  # the torn one removed, the whole one kept


def test_a_second_trainer_on_a_live_runs_output_dir_is_refused(tiny_text_model_dir, tmp_path):
    out = tmp_path / "out"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write_lock(out, live.pid)
        trainer = ZPPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(tiny_text_model_dir),
            reward_funcs=hashed_reward,
            args=ZPPOConfig(**settings(out, max_steps=2)),
            train_dataset=Dataset.from_list(QUESTIONS),
            processing_class=AutoTokenizer.from_pretrained(tiny_text_model_dir),
        )
        with pytest.raises(RunLocked, match=rf"output_dir {out} is in use by another run \(PID {live.pid} on "):
            trainer.train()
        assert trainer.state.global_step == 0 and json.loads((out / LOCK_NAME).read_text())["pid"] == live.pid
    finally:
        live.kill()
        live.wait()


# ---------------------------------------------------------------------- a judge that stops answering


def test_a_group_with_an_unscored_rollout_leaves_the_step():
    from zppo_trl.rollout import FILLER, plain_accuracy
    from zppo_trl.rounds import without_unscored as _without_unscored

    groups = [[("new", "a"), ("new", "b")], [("replay", "c"), (FILLER, "a")]]
    unscored = torch.tensor([False, False, False, True, False, False, False, False])  # b's second rollout
    kept, left_out = _without_unscored(groups, unscored, 2)
    assert kept == [[("new", "a"), (FILLER, "b")], [("replay", "c"), (FILLER, "a")]] and left_out == 1
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    assert plain_accuracy(kept, rewards, 2, order=["a", "b", "c"]) == {"a": 0.5, "c": 1.0}  # b: no accuracy


class _ShortJudge(TeacherClient):
    """The real client, asking the tiny served model for short verdicts (it writes no JSON verdict anyway: each
    is unparseable, so wrong, while the server answers)."""

    def judge(self, items, max_tokens=8, **kwargs):
        return super().judge(items, max_tokens, **kwargs)


@pytest.mark.integration
def test_a_judge_killed_mid_run_leaves_its_groups_out_counted(make_server, tiny_text_model_dir, tmp_path, capsys):
    """A judge server SIGKILLed after the first rollout step: the second step's verdicts fail, and its groups leave
    the step (nothing admitted to the buffer from them, nothing trained), counted on the metrics, the console and
    the card's counters, with the judge's failures logged as zppo/judge/failures."""
    server = make_server()
    judge = _ShortJudge(server.base_url, server.model, max_retries=0, timeout=60)
    out = tmp_path / "out"
    trainer = ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_text_model_dir),
        reward_funcs=judged_accuracy_reward(judge),
        args=ZPPOConfig(**settings(out, max_steps=4, save_strategy="no")),
        train_dataset=Dataset.from_list(QUESTIONS),
        processing_class=AutoTokenizer.from_pretrained(tiny_text_model_dir),
        callbacks=[kill_after_first_rollout_step(server)],
    )
    trainer.train()
    judge.close()
    first, second = [h for h in trainer.state.log_history if "zppo/rollout_steps" in h]
    assert (
        first["zppo/judge/requests"] > 0 and first["zppo/judge/failures"] == 0 and first["zppo/unscored_groups"] == 0
    )
    assert first["zppo/admitted"] > 0  # every answer wrong while the judge answered: hard questions admitted
    groups = second["zppo/new"] + second["zppo/replayed"]
    assert second["zppo/judge/failures"] == second["zppo/judge/requests"] > 0
    assert second["zppo/unscored_groups"] == groups and second["zppo/admitted"] == 0 and second["zppo/graduated"] == 0
    assert second["zppo/skipped_partitions"] == 2  # nothing left to train on
    assert trainer.counters["unscored_groups_total"] == groups
    console = capsys.readouterr().out
    assert f"{int(groups)} groups unscored (left out)" in console and "judge " in console
