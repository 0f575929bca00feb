"""Stopping cleanly when the cluster asks: SIGTERM (a time limit, a preemption) or SIGUSR1 (what a Slurm script asks
for ahead of its limit with ``--signal=USR1@<seconds>``).

A checkpoint holds a whole rollout step: its ``num_partitions`` updates train on rollouts generated once, so a
checkpoint between them would have to carry the rollouts too. So on a signal the trainer:

1. notes it and goes on (a handler only sets a flag: the step in progress is never torn);
2. at the end of the rollout step in progress (its remaining updates need no generation), every rank agrees
   whether any rank was signalled (one collective per rollout step, at a point every rank reaches together);
3. if so, TRL writes the checkpoint with the ZPPO state, training stops, ``train()`` returns with
   :attr:`Preemption.preempted` true (``trainer.preemption``), the lock is released, and the recipe exits with
   :data:`PREEMPTED_EXIT` (75, ``EX_TEMPFAIL``: "try again"), which the launch scripts requeue on.

The time from signal to exit is at most the rest of the rollout step plus the save. ``preemption_grace_seconds`` is
that budget: the launch scripts ask Slurm for the signal that long before the kill, and the trainer warns, once it
has timed a rollout step and a save, where one no longer fits, naming both. A second signal leaves at once (its
default action), for the user who means it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

from transformers import TrainerCallback

__all__ = ["PREEMPTED_EXIT", "PREEMPTION_SIGNALS", "Preemption", "PreemptionCallback"]

logger = logging.getLogger(__name__)

# sysexits.h's EX_TEMPFAIL: "a temporary failure; the user is invited to retry". The launch scripts requeue on it.
PREEMPTED_EXIT = 75
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preemption:
    """The trainer's view of the cluster's stop signals: installed for the length of ``train()`` (main thread only),
    asked at every rollout-step boundary whether to stop there.

    Args:
        grace_seconds: the time between the signal and the kill that the run plans for.
        agree: ``flag -> whether any rank's flag is set`` (a collective over ranks; identity on one).
        clock: monotonic seconds (a test's stand-in).
    """

    def __init__(
        self, grace_seconds: float, agree: Callable[[bool], bool], clock: Callable[[], float] = time.monotonic
    ):
        self.grace_seconds = grace_seconds
        self.agree = agree
        self.clock = clock
        self.received: int | None = None  # the signal, once one arrived
        self.received_at: float | None = None
        self.stopped_at: int | None = None  # the optimizer step whose checkpoint ends the run
        self._previous: dict[int, object] = {}
        self._warned = False

    @property
    def preempted(self) -> bool:
        """Whether the last training stopped on a stop signal, its last rollout step's checkpoint written."""
        return self.stopped_at is not None

    @contextlib.contextmanager
    def installed(self, output_dir: str) -> Iterator[None]:
        """Hold the stop signals for the block (a training run; a no-op off the main thread, where Python cannot
        handle them), give them back after, and say where a stopped run's updates are."""
        self.received = self.received_at = self.stopped_at = None
        if threading.current_thread() is threading.main_thread():
            for signum in PREEMPTION_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        try:
            yield
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

    def stop_here(self) -> bool:
        """At a rollout-step boundary, every rank together: whether any rank was signalled (then this step's
        checkpoint ends the run)."""
        return self.agree(self.received is not None)

    def check_budget(self, rollout_step_seconds: float, save_seconds: float) -> None:
        """Warn once where the rest of a rollout step plus a save no longer fits ``grace_seconds``."""
        needed = rollout_step_seconds + save_seconds
        if self._warned or needed <= self.grace_seconds:
            return
        self._warned = True
        logger.warning(
            "a rollout step took %.0f s and a checkpoint %.0f s: a stop signal %.0f s before the kill "
            "(preemption_grace_seconds) may not leave time to finish both; raise preemption_grace_seconds and the "
            "launch script's --signal lead time to at least %.0f s",
            rollout_step_seconds, save_seconds, self.grace_seconds, needed,
        )  # fmt: skip


class PreemptionCallback(TrainerCallback):
    """At every rollout-step boundary (``num_partitions`` updates), ask :class:`Preemption` whether to stop there:
    then the step's checkpoint is written and training ends. Times a rollout step and a save for the grace check."""

    def __init__(self, preemption: Preemption, updates_per_rollout_step: int):
        self.preemption = preemption
        self.updates = updates_per_rollout_step
        self._step_started: float | None = None
        self._rollout_step_seconds = 0.0
        self._save_started: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._step_started = self.preemption.clock()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.updates:
            return  # mid rollout step: its remaining updates train on rollouts already generated
        now = self.preemption.clock()
        if self._step_started is not None:
            self._rollout_step_seconds = max(self._rollout_step_seconds, now - self._step_started)
        self._step_started = now
        if self.preemption.stop_here():
            control.should_save = True
            control.should_training_stop = True
            self.preemption.stopped_at = state.global_step
        if control.should_save:
            self._save_started = now

    def on_save(self, args, state, control, **kwargs):
        if self._save_started is None:
            return
        now = self.preemption.clock()
        self.preemption.check_budget(self._rollout_step_seconds, now - self._save_started)
        self._save_started = None
        self._step_started = now  # the save is not the next rollout step's time
