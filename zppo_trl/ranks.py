"""Where this process stands among the training ranks, and how the rollout step's decisions are shared.

Every decision of a rollout step (the replay draw, the hard-question ranking, the caps, the plan, the
partitions, the buffer refresh) is made identically on every rank from gathered data; what each rank
*does* (the groups it generates, the instances it builds) is its round-robin share. This module is the
one place that knows the rank arithmetic and the collectives, so the trainer's stages read as the
algorithm rather than as bookkeeping.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
from accelerate.utils import gather_object

__all__ = ["Ranks"]

T = TypeVar("T")


class Ranks:
    """The training ranks as seen from this process (``accelerate``'s ``num_processes``/``process_index``)."""

    def __init__(self, accelerator: Any):
        self.accelerator = accelerator
        self.world: int = accelerator.num_processes
        self.rank: int = accelerator.process_index

    @property
    def device(self) -> torch.device:
        """This rank's device (where collectives take their tensors)."""
        return self.accelerator.device

    def share(self, items: Sequence[T]) -> list[T]:
        """This rank's round-robin share of ``items`` (the same list on every rank)."""
        return list(items)[self.rank :: self.world]

    def shortfall(self, total: int) -> int:
        """How many items this rank lacks of the largest share when ``total`` items are dealt round-robin."""
        return math.ceil(total / self.world) - len(range(self.rank, total, self.world))

    def gather(self, value: T) -> list[T]:
        """``value`` of every rank, indexed by rank (a picklable object)."""
        return list(gather_object([value]))

    def total(self, value: float) -> Any:
        """The sum of ``value`` over ranks (Python numbers, gathered as objects)."""
        return sum(self.gather(value))

    def largest(self, value: float) -> Any:
        """The maximum of ``value`` over ranks."""
        return max(self.gather(value))

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``tensor`` over ranks (a collective only where there are several)."""
        return self.accelerator.reduce(tensor, reduction="sum") if self.world > 1 else tensor
