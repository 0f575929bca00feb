"""The prompt replay buffer (Algorithm 1, Steps 1 and 6).

The buffer holds question keys (dataset row ids), never responses and never
reformulated prompts. After each rollout step it is refreshed from the *plain* groups
only: a question whose plain-group accuracy is below ``threshold`` is admitted (or, if
already resident, retained in place), a resident at or above it graduates, and the
oldest residents are evicted first-in-first-out while the buffer is over capacity.
Replay draws are uniform without replacement, taken before the refresh.

This module is pure: no TRL, no trainer.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field

__all__ = ["PromptReplayBuffer", "ReplayEvents", "replay_count"]

Key = Hashable  # in practice int or str: keys must survive a JSON round trip


def replay_count(num_new: int, fraction: float, buffer_size: int) -> int:
    """``min(floor(fraction * num_new), buffer_size)``: how many residents one step replays."""
    if num_new < 0 or buffer_size < 0:
        raise ValueError(f"num_new and buffer_size must be >= 0, got {num_new} and {buffer_size}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"replay fraction must be in [0, 1], got {fraction}")
    # The epsilon keeps 0.29 * 100 (= 28.999...) from flooring to 28.
    return min(math.floor(fraction * num_new + 1e-9), buffer_size)


@dataclass
class ReplayEvents:
    """What one :meth:`PromptReplayBuffer.update` did, each list in processing order."""

    admitted: list = field(default_factory=list)
    retained: list = field(default_factory=list)
    graduated: list = field(default_factory=list)
    evicted: list = field(default_factory=list)


class PromptReplayBuffer:
    """FIFO buffer of hard question keys with threshold admission and graduation.

    Args:
        capacity: maximum residents (|B|_max, paper: 10,000).
        threshold: tau; plain accuracy ``< threshold`` is hard (paper: 0.5).
    """

    def __init__(self, capacity: int = 10_000, threshold: float = 0.5):
        if not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity must be a non-negative integer, got {capacity!r}")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        self.capacity = capacity
        self.threshold = threshold
        self._residents: dict[Key, None] = {}  # insertion order is FIFO order

    def __len__(self) -> int:
        return len(self._residents)

    def __contains__(self, key: object) -> bool:
        return key in self._residents

    def __iter__(self) -> Iterator[Key]:
        return iter(self._residents)

    def __repr__(self) -> str:
        return f"PromptReplayBuffer(size={len(self)}, capacity={self.capacity}, threshold={self.threshold})"

    def residents(self) -> list[Key]:
        """Resident keys, oldest first."""
        return list(self._residents)

    def sample(self, k: int, rng: random.Random | int | None = None) -> list[Key]:
        """``min(k, len(self))`` distinct residents, drawn uniformly without replacement."""
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        rng = rng if isinstance(rng, random.Random) else random.Random(rng)
        return rng.sample(list(self._residents), min(k, len(self._residents)))

    def update(self, accuracy: Mapping[Key, float]) -> ReplayEvents:
        """Refresh from plain-group accuracies ``{key: r_x}`` and return what changed.

        Hard (``r_x < threshold``): admitted at the back, or retained where it already
        sits. Not hard: a resident graduates; a non-resident is ignored. Then the oldest
        residents are evicted until ``len(self) <= capacity``.
        """
        events = ReplayEvents()
        for key, r in accuracy.items():
            _check_key(key)
            if not (isinstance(r, (int, float)) and 0.0 <= r <= 1.0):
                raise ValueError(f"accuracy of {key!r} must be a number in [0, 1], got {r!r}")
            if r < self.threshold:
                if key in self._residents:
                    events.retained.append(key)
                else:
                    self._residents[key] = None
                    events.admitted.append(key)
            elif key in self._residents:
                del self._residents[key]
                events.graduated.append(key)
        overflow = len(self._residents) - self.capacity
        if overflow > 0:
            oldest = list(self._residents)[:overflow]  # dicts keep insertion order
            for key in oldest:
                del self._residents[key]
            events.evicted = oldest
        return events

    def state_dict(self) -> dict:
        """JSON-serialisable state; :meth:`load_state_dict` restores it exactly."""
        return {"capacity": self.capacity, "threshold": self.threshold, "residents": list(self._residents)}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore the state written by :meth:`state_dict` (residents in FIFO order)."""
        residents = list(state["residents"])
        for key in residents:
            _check_key(key)
        if len(set(residents)) != len(residents):
            raise ValueError("replay buffer state lists a resident twice")
        self.capacity = int(state["capacity"])
        self.threshold = float(state["threshold"])
        self._residents = dict.fromkeys(residents)


def _check_key(key: object) -> None:
    # bool is an int subclass but would come back from JSON as a bool, which is fine;
    # tuples, floats and objects would not come back equal, so they are refused up front.
    if not isinstance(key, (int, str)):
        raise TypeError(f"replay keys must be int or str (dataset row ids), got {type(key).__name__}: {key!r}")
