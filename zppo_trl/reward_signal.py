"""Rewards that cannot teach, said once and loudly, in the step where it shows.

GRPO learns from the differences between a group's rewards. A reward function that gives every rollout of a
rollout step the same value teaches nothing that step, and when it does so for a reason of its own (it reads a
completion in a format it does not expect: ``len()`` of a chat completion is 1 for every rollout, a message list
never contains the answer's text) every update of the run is skipped, counted as "no signal", and nothing fails.

:class:`RewardSignalWatch` reads each plain round's rewards, per reward function and summed: a function, or the
weighted sum, that gives every rollout of the round one value is warned about once per run, with what to check,

* at the first rollout step of a run (or of a resumed one), whatever the value: a broken function shows
  there, before a run is spent;
* at any later step when the value is not 0. Under verifiable rewards 0 is a wrong answer, so a later step whose
  rollouts all score 0 is a genuinely all-wrong step (the student failed every question, every group without
  signal): it stays what it was, counted in the step's skipped updates and logged, and is not warned about.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

__all__ = ["RewardSignalWatch", "constant_value"]

logger = logging.getLogger(__name__)

WEIGHTED = "the weighted sum of the reward functions"


def constant_value(rewards: torch.Tensor) -> float | None:
    """The value every scored entry of ``rewards`` has (NaN entries, unscored, left out), or None where they differ
    or none was scored."""
    scored = rewards[~torch.isnan(rewards)]
    if scored.numel() == 0 or not bool((scored == scored[0]).all()):
        return None
    return float(scored[0])


class RewardSignalWatch:
    """Warns once per reward function (and once for their weighted sum) whose rewards carry no signal in a
    step, as the module says.

    Args:
        names: the reward functions' names, in the order of ``rewards_per_func``'s columns.
        completion_format: how completions reach the reward functions, for the message (e.g. "strings").
    """

    def __init__(self, names: Sequence[str], completion_format: str):
        self.names = list(names)
        self.completion_format = completion_format
        self.warned: set[str] = set()
        self.steps_checked = 0

    def check(self, rewards_per_func: torch.Tensor, weighted: torch.Tensor, step: int) -> list[str]:
        """Check one plain round's rewards (``rewards_per_func``: rollouts x functions; ``weighted``: their weighted
        sum per rollout) at rollout step ``step``; log and return the warnings said now."""
        first = self.steps_checked == 0
        self.steps_checked += 1
        said = []
        columns = [(name, rewards_per_func[:, i]) for i, name in enumerate(self.names)]
        if len(self.names) > 1:
            columns.append((WEIGHTED, weighted))
        for name, rewards in columns:
            value = constant_value(rewards)
            if value is None or name in self.warned or not (first or value != 0.0):
                continue
            self.warned.add(name)
            said.append(self._message(name, value, int((~torch.isnan(rewards)).sum()), step))
        for message in said:
            logger.warning(message)
        return said

    def _message(self, name: str, value: float, count: int, step: int) -> str:
        what = name if name == WEIGHTED else f"reward function {name!r}"
        shown = int(value) if math.isfinite(value) and value == int(value) else value
        return (
            f"NO LEARNING SIGNAL: {what} gave all {count} rollouts of rollout step {step} the same reward ({shown}), "
            "so no update can learn from it; where every reward does, every update is skipped. Check that it can "
            f"tell rollouts apart: reward functions receive completions as {self.completion_format} (TRL's format for "
            "this dataset), so a function written for another format may score every rollout alike (len() of a "
            "chat completion is 1); that it reads the dataset columns it needs; and that the student answers some "
            "questions and misses others. Said once per run for each function"
        )
