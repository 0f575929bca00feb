"""`zppo_trl.preemption`: a stop signal is noted, never acted on mid rollout step; every rank stops at the same
rollout-step boundary, checkpointed; a second signal leaves at once. The trainer runs it on one rank in
tests/test_recipe.py (the recipe stopped by SIGTERM exits 75 and its rerun resumes) and on two in
tests/test_distributed.py (one rank signalled, both stop at one checkpoint, the resume ends as the straight run)."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import TrainerControl

import zppo_trl.preemption as preemption_module
from zppo_trl.preemption import Preemption, PreemptionCallback, StepSnapshot


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_real_signal_is_noted_and_the_handlers_are_given_back(tmp_path, caplog):
    asked = []
    preemption = Preemption(600, agree=lambda flag: asked.append(flag) or flag)
    before = signal.getsignal(signal.SIGUSR1)
    with caplog.at_level(logging.WARNING, logger="zppo_trl.preemption"):
        with preemption.installed(str(tmp_path)):
            assert not preemption.stop_here()
            os.kill(os.getpid(), signal.SIGUSR1)  # what Slurm's --signal=USR1@600 sends
            assert preemption.received == signal.SIGUSR1 and preemption.stop_here()
            preemption.stopped_at = 6
    assert signal.getsignal(signal.SIGUSR1) is before and asked == [False, True]
    assert "SIGUSR1 received: finishing the rollout step in progress" in caplog.text
    assert f"stopped by a signal after 6 optimizer updates, all in {tmp_path / 'checkpoint-6'}" in caplog.text
    with preemption.installed(str(tmp_path)):  # a new train() starts unsignalled
        assert preemption.received is None and not preemption.preempted


def test_the_callback_stops_only_at_a_rollout_step_boundary_and_times_the_grace(caplog):
    clock, asked = Clock(), []
    preemption = Preemption(100, agree=lambda flag: asked.append(flag) or flag, clock=clock)
    callback = PreemptionCallback(preemption, updates_per_rollout_step=3)
    control = TrainerControl()
    preemption.begin_rollout_step()  # rollout step 2 starts at 0 s (no snapshot: this preemption never leaves one)
    preemption.received = signal.SIGTERM  # arrives during update 4
    for step in (4, 5):  # the rest of the rollout step trains on rollouts already generated: no collective, no stop
        clock.now += 10
        callback.on_step_end(None, SimpleNamespace(global_step=step), control)
        assert not control.should_training_stop and asked == []
    clock.now += 90
    callback.on_step_end(None, SimpleNamespace(global_step=6), control)
    assert control.should_save and control.should_training_stop and preemption.stopped_at == 6 and asked == [True]
    clock.now += 30  # the save
    with caplog.at_level(logging.WARNING, logger="zppo_trl.preemption"):
        callback.on_save(None, SimpleNamespace(global_step=6), control)
    # a rollout step took 110 s and the save 30 s: 140 s do not fit the 100 s grace
    assert "a rollout step took 110 s and a checkpoint 30 s" in caplog.text and "at least 140 s" in caplog.text


def test_a_step_is_left_only_where_its_rest_and_a_save_would_not_fit_and_its_start_is_put_back(tmp_path):
    clock, state, saved = Clock(), SimpleNamespace(value=1), []
    state.state_dict = lambda: {"value": state.value}
    state.load_state_dict = lambda d: setattr(state, "value", d["value"])
    preemption = Preemption(100, agree=bool, snapshot=StepSnapshot(state), save=lambda: saved.append(state.value),
                            clock=clock)  # fmt: skip
    preemption.begin_rollout_step()
    preemption.leave_rollout_step(2)  # no signal: nothing to leave
    preemption.received, preemption.received_at = signal.SIGTERM, 0.0
    preemption.leave_rollout_step(2)  # no step timed yet: finish it
    preemption.step_seconds, preemption.save_seconds = 60.0, 10.0
    clock.now = 20.0  # 20 s since the signal and the step's start: 40 s left of it + a 10 s save = 70 s <= 100 s
    preemption.leave_rollout_step(2)
    with preemption.installed(str(tmp_path)):
        preemption.received, preemption.received_at = signal.SIGTERM, 0.0
        preemption.begin_rollout_step()  # at 20 s; the step then draws, moves the RNGs and changes the state
        draws = (random.random(), torch.rand(2))
        state.value = 2
        clock.now = 60.0  # 60 s since the signal, 20 s of the step left, a 10 s save: 90 s <= 100 s
        preemption.leave_rollout_step(4)
        clock.now = 95.0  # 95 s since the signal, the step's timed 60 s over, a 10 s save: 105 s > 100 s: leave it
        preemption.leave_rollout_step(4)
    # the step's start is what the checkpoint holds: the state and the RNGs as they were
    assert preemption.stopped_at == 4 and saved == [1] and state.value == 1
    assert random.random() == draws[0] and torch.equal(torch.rand(2), draws[1])
    (tmp_path / "checkpoint-6").mkdir()  # a boundary save_steps wrote already is not written again
    with preemption.installed(str(tmp_path)):
        preemption.received, preemption.received_at = signal.SIGTERM, 0.0
        preemption.begin_rollout_step()
        preemption.leave_rollout_step(6)
    assert preemption.stopped_at == 6 and saved == [1]


def test_a_second_signal_leaves_at_once():
    script = textwrap.dedent(
        """
        import importlib.util, os, signal, sys, time
        spec = importlib.util.spec_from_file_location("preemption", sys.argv[1])  # the module alone: a quick start
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        Preemption = module.Preemption
        preemption = Preemption(600, agree=bool)
        with preemption.installed("."):
            os.kill(os.getpid(), signal.SIGTERM)
            print("noted", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        """
    )
    module = Path(preemption_module.__file__)
    run = subprocess.run([sys.executable, "-c", script, str(module)], capture_output=True, text=True, timeout=60)
    assert run.stdout == "noted\n" and run.returncode == -signal.SIGTERM, run.stderr
