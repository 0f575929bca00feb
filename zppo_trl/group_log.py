"""Every group a rollout step scored, for analyses of a run (``log_groups: true``): ``groups.jsonl``.

The step's metrics say how many BCQ groups carried a signal or how often the student was right inside them;
what they cannot say is *which* questions: whether the student is right more often inside a BCQ prompt than
without it on the same question, or which hard questions gave any learning signal at all. This file keeps
that, one line per rollout step, appended by the main process:

    {"step": s, "groups": [{"kind": "new", "id": key, "rewards": [G floats]}, ...]}

``step`` counts rollout steps from 1; ``kind`` is ``new`` or ``replay`` for a plain group and the row's
augmentation kind for a reformulated one (``bcq``, ``ncq``, ``hint``, ...), in the order the step generated
them; ``rewards`` are the group's rollout rewards as the update read them. Filler groups (generated only to
keep ranks' row counts equal) and groups left out of the step are not written. A run resumed from a checkpoint
re-does the steps after it and appends them again; :func:`read_group_log` keeps each step's last line.

This module is the file alone: no TRL, no trainer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Iterable, Sequence

from .appended_log import read_appended

__all__ = ["GROUP_LOG_NAME", "GroupLog", "read_group_log"]

GROUP_LOG_NAME = "groups.jsonl"


class GroupLog:
    """Appends one line per rollout step to ``path``."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)

    def write(self, step: int, groups: Iterable[tuple[str, Hashable, Sequence[float]]]) -> None:
        """The step's groups as ``(kind, question id, rewards)``."""
        line = {
            "step": step,
            "groups": [
                {"kind": kind, "id": key, "rewards": [float(r) for r in rewards]} for kind, key, rewards in groups
            ],
        }
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")


def read_group_log(path: str | os.PathLike) -> dict[int, list[dict]]:
    """Rollout step -> its groups (dicts with ``kind``, ``id``, ``rewards``), in step order; a step written twice
    (a resumed run) keeps its last line. A torn last line (the run killed mid-write) is dropped; any other bad
    line raises ValueError naming it."""
    steps: dict[int, list[dict]] = {}
    for number, record in read_appended(path):
        try:
            step, groups = int(record["step"]), record["groups"]
            if not all({"kind", "id", "rewards"} <= set(group) for group in groups):
                raise KeyError("a group without kind, id or rewards")
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}:{number} is not a group log line ({err})") from None
        steps[step] = groups
    return dict(sorted(steps.items()))
