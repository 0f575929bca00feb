"""Stopping cleanly when the cluster asks: SIGTERM (a time limit, a preemption) or SIGUSR1 (what a Slurm script asks
for ahead of its limit with ``--signal=USR1@<seconds>``).

A checkpoint holds a whole rollout step: its ``num_partitions`` updates train on rollouts generated once, so a
checkpoint between them would have to carry the rollouts too. So on a signal the trainer:

1. notes it and goes on (a handler only sets a flag: the step in progress is never torn);
2. at the end of the rollout step in progress (its remaining updates need no generation), every rank agrees
   whether any rank was signalled (one collective per rollout step, at a point every rank reaches together);
3. if so, TRL writes the checkpoint with the ZPPO state, training stops, ``train()`` returns with
   :attr:`Preemption.preempted` true (``trainer.preemption``), the lock is released, and the recipe exits with
   :data:`PREEMPTED_EXIT` (75, ``EX_TEMPFAIL``: "try again") for a requeue wrapper to test; the Slurm script
   requeues on the signal it passed on.

The time from signal to exit is then at most the rest of the rollout step plus the save.
``preemption_grace_seconds`` is that budget: the launch scripts ask Slurm for the signal that long before the kill.
Where the rest of a step would not fit it, the step is abandoned instead. Once its plain round is scored (every
rank there together: a second collective per rollout step), if a signal came and the rest of the step, timed on the
steps before, plus a save would end after the budget, every rank leaves the step (:class:`RolloutAbandoned`). No
update of that step has run, so the weights and optimizer are those of the step's start; the ZPPO state and the
RNGs are put back as they were then (:class:`StepSnapshot`), and that boundary is checkpointed (unless
``save_steps`` wrote it already). Only the abandoned step's generation is lost. The trainer warns, once it has timed
a rollout step and a save, where the two no longer fit the budget, naming both. A second signal leaves at once (its
default action), for the user who means it.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

__all__ = [
    "PREEMPTED_EXIT",
    "PREEMPTION_SIGNALS",
    "Preemption",
    "PreemptionCallback",
    "RolloutAbandoned",
    "StepSnapshot",
]

logger = logging.getLogger(__name__)

# sysexits.h's EX_TEMPFAIL: "a temporary failure; the user is invited to retry": a requeue wrapper's cue.
PREEMPTED_EXIT = 75
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class RolloutAbandoned(Exception):
    """Every rank leaves the rollout step in progress (at optimizer step ``args[0]``): finishing it would not fit the
    grace period."""


class StepSnapshot:
    """The state a rollout step starts from beyond the weights and optimizer (which generation leaves alone): the
    ZPPO state (a :class:`~zppo_trl.checkpoint_state.ZPPOState`) and the process's RNGs, those TRL's checkpoints
    save."""

    def __init__(self, state: Any):
        self.state = state
        self.saved: dict | None = None
        self.rngs: dict[str, Any] = {}

    def take(self) -> None:
        self.saved = copy.deepcopy(self.state.state_dict())
        self.rngs = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            self.rngs["cuda"] = torch.cuda.get_rng_state_all()

    def restore(self) -> None:
        self.state.load_state_dict(self.saved)
        random.setstate(self.rngs["python"])
        np.random.set_state(self.rngs["numpy"])
        torch.set_rng_state(self.rngs["cpu"])
        if "cuda" in self.rngs:
            torch.cuda.set_rng_state_all(self.rngs["cuda"])


class Preemption:
    """The trainer's view of the cluster's stop signals: installed for the length of ``train()`` (main thread only),
    asked at every rollout-step boundary whether to stop there, and once a step's plain round is scored whether to
    leave that step.

    Args:
        grace_seconds: the time between the signal and the kill that the run plans for.
        agree: ``flag -> whether any rank's flag is set`` (a collective over ranks; identity on one).
        snapshot: the rollout step's starting state, put back where a step is abandoned (None: never abandon).
        save: writes the checkpoint of the run's current optimizer step (TRL's, on every rank), where a step is
            abandoned.
        clock: monotonic seconds (a test's stand-in).
    """

    def __init__(
        self,
        grace_seconds: float,
        agree: Callable[[bool], bool],
        snapshot: StepSnapshot | None = None,
        save: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.grace_seconds = grace_seconds
        self.agree = agree
        self.snapshot = snapshot
        self.save = save
        self.clock = clock
        self.received: int | None = None  # the signal, once one arrived
        self.received_at: float | None = None
        self.stopped_at: int | None = None  # the optimizer step whose checkpoint ends the run
        self.step_started: float | None = None
        self.step_seconds = 0.0  # the longest rollout step and save so far (timed by PreemptionCallback)
        self.save_seconds = 0.0
        self._previous: dict[int, object] = {}
        self._warned = False

    @property
    def preempted(self) -> bool:
        """Whether the last training stopped on a stop signal, its last whole rollout step checkpointed."""
        return self.stopped_at is not None

    @contextlib.contextmanager
    def installed(self, output_dir: str) -> Iterator[None]:
        """Hold the stop signals for the block (a training run; a no-op off the main thread, where Python cannot
        handle them) and give them back after; checkpoint the start of an abandoned step; say where a stopped run's
        updates are."""
        self.received = self.received_at = self.stopped_at = None
        if threading.current_thread() is threading.main_thread():
            for signum in PREEMPTION_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        try:
            yield
        except RolloutAbandoned as stop:
            self.snapshot.restore()  # the state the step started from: no update of it has run
            self.stopped_at = stop.args[0]
            if not os.path.isdir(os.path.join(output_dir, f"checkpoint-{self.stopped_at}")):
                self.save()
        finally:
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
            self._previous.clear()
        if self.preempted:
            logger.warning(
                "stopped by a signal after %d optimizer updates, all in %s: run the same command to resume",
                self.stopped_at, os.path.join(output_dir, f"checkpoint-{self.stopped_at}"),
            )  # fmt: skip

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is not None:  # the second signal: leave now, as the signal's default action does
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received, self.received_at = signum, self.clock()
        logger.warning(
            "%s received: finishing the rollout step in progress, then writing a checkpoint and exiting with %d "
            "(a second signal exits at once)",
            signal.Signals(signum).name, PREEMPTED_EXIT,
        )  # fmt: skip

    def begin_rollout_step(self) -> None:
        """A rollout step starts: its time, and the state it starts from."""
        self.step_started = self.clock()
        if self.snapshot is not None:
            self.snapshot.take()

    def leave_rollout_step(self, step: int) -> None:
        """Once the step's plain round is scored, every rank together: raise :class:`RolloutAbandoned` (``step``: the
        optimizer step the run is at) where a signal came and the rest of the step, timed on the steps before, plus a
        save would end after the grace period. With no step timed yet, the step is finished."""
        late = False
        if self.received is not None and self.step_seconds and self.snapshot is not None:
            now = self.clock()
            rest = max(self.step_seconds - (now - self.step_started), 0.0)
            late = (now - self.received_at) + rest + self.save_seconds > self.grace_seconds
        if self.agree(late):
            logger.warning("the rest of this rollout step would not fit the grace period: leaving it at step %d", step)
            raise RolloutAbandoned(step)

    def stop_here(self) -> bool:
        """At a rollout-step boundary, every rank together: whether any rank was signalled (then this step's
        checkpoint ends the run)."""
        return self.agree(self.received is not None)

    def check_budget(self, save_seconds: float) -> None:
        """Note a save's time; warn once where the longest rollout step and a save no longer fit ``grace_seconds``."""
        self.save_seconds = max(self.save_seconds, save_seconds)
        needed = self.step_seconds + save_seconds
        if self._warned or needed <= self.grace_seconds:
            return
        self._warned = True
        logger.warning(
            "a rollout step took %.0f s and a checkpoint %.0f s: a stop signal %.0f s before the kill "
            "(preemption_grace_seconds) may not leave time to finish both, and a step in progress would be abandoned; "
            "raise preemption_grace_seconds and the launch script's --signal lead time to at least %.0f s",
            self.step_seconds, save_seconds, self.grace_seconds, needed,
        )  # fmt: skip


class PreemptionCallback(TrainerCallback):
    """At every rollout-step boundary (``num_partitions`` updates), ask :class:`Preemption` whether to stop there:
    then the step's checkpoint is written and training ends. Times each rollout step (from
    :meth:`Preemption.begin_rollout_step` to its boundary) and each save, for the grace check."""

    def __init__(self, preemption: Preemption, updates_per_rollout_step: int):
        self.preemption = preemption
        self.updates = updates_per_rollout_step
        self._save_started: float | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.updates:
            return  # mid rollout step: its remaining updates train on rollouts already generated
        preemption, now = self.preemption, self.preemption.clock()
        if preemption.step_started is not None:
            preemption.step_seconds = max(preemption.step_seconds, now - preemption.step_started)
        if preemption.stop_here():
            control.should_save = True
            control.should_training_stop = True
            preemption.stopped_at = state.global_step
        if control.should_save:
            self._save_started = now

    def on_save(self, args, state, control, **kwargs):
        if self._save_started is not None:
            self.preemption.check_budget(self.preemption.clock() - self._save_started)
            self._save_started = None
