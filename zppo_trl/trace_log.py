"""What the trace-overlap audit reads from a training run (``audit_traces: true``): ``audit_traces.jsonl``.

Source of truth: the paper's appendix on the trace-overlap diagnostic. For every question that
left the 0% admission bin (admitted at plain accuracy 0, later graduated: a plain group with
``r_x >= tau``) the audit takes all ``G_S`` rollouts of that later plain group, wrong ones included,
and pairs each with one teacher response, held fixed per question. Here that reference is the first
teacher candidate a BCQ prompt showed the student for the question while it sat in the 0% bin
(compressed, under the run's candidate content: the text the student saw during training).

The file holds two kinds of line, appended as the run goes (main process only):

    {"kind": "reference", "step": s, "id": key, "question": text, "reference": shown teacher candidate}
    {"kind": "graduation", "step": s, "id": key, "question": text, "rollouts": [G texts], "rewards": [G]}

A question's reference is its first ``reference`` line; its rollouts are its last ``graduation``
line (a run resumed from a checkpoint re-does the steps after it and appends them again).
Rows without a teacher (GRPO†, the control) write graduations only: the audit then takes the
references of another run (``--references``), which is how the paper holds them fixed across rows.

This module is the file alone: no TRL, no trainer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from .appended_log import read_appended

__all__ = ["TRACE_LOG_NAME", "AuditQuestion", "TraceLog", "read_trace_log"]

TRACE_LOG_NAME = "audit_traces.jsonl"


class TraceLog:
    """Appends the audit's lines to ``path``; remembers which questions already have their reference."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._referenced: set[Hashable] = set()
        if os.path.exists(self.path):  # a resumed run keeps the references it already wrote
            questions = read_trace_log(self.path, graduated_only=False)
            self._referenced = {key for key, q in questions.items() if q.reference is not None}

    def has_reference(self, key: Hashable) -> bool:
        return key in self._referenced

    def references(self, step: int, items: Iterable[tuple[Hashable, str, str]]) -> None:
        """``(key, question, shown teacher candidate)`` of BCQ prompts; only a question's first is written."""
        lines = []
        for key, question, reference in items:
            if key not in self._referenced:
                self._referenced.add(key)
                lines.append({"kind": "reference", "step": step, "id": key, "question": question,
                              "reference": reference})  # fmt: skip
        self._append(lines)

    def graduations(self, step: int, items: Iterable[tuple[Hashable, str, Sequence[str], Sequence[float]]]) -> None:
        """``(key, question, rollouts, rewards)`` of the plain groups that graduated from the 0% bin."""
        self._append(
            [
                {
                    "kind": "graduation",
                    "step": step,
                    "id": key,
                    "question": question,
                    "rollouts": list(rollouts),
                    "rewards": [float(r) for r in rewards],
                }  # fmt: skip
                for key, question, rollouts, rewards in items
            ]
        )

    def _append(self, lines: list[dict]) -> None:
        if not lines:
            return
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)


@dataclass
class AuditQuestion:
    """One question of the audit: its text, fixed teacher reference (None: the run showed none) and the
    plain rollouts of the group it graduated with (empty: it has not graduated from the 0% bin)."""

    id: Hashable
    question: str
    reference: str | None = None
    reference_step: int | None = None
    graduation_step: int | None = None
    rollouts: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)


def read_trace_log(path: str | os.PathLike, graduated_only: bool = True) -> dict[Hashable, AuditQuestion]:
    """The questions of an ``audit_traces.jsonl``, in first-seen order (``graduated_only``: those with a
    graduation line). A torn last line (the run killed mid-write) is ignored; any other bad line raises
    ValueError naming it."""
    questions: dict[Hashable, AuditQuestion] = {}
    for number, record in read_appended(path):
        try:
            kind, key = record["kind"], record["id"]
        except (KeyError, TypeError) as err:
            raise ValueError(f"{path}:{number} is not an audit trace line ({err})") from None
        entry = questions.setdefault(key, AuditQuestion(key, record.get("question", "")))
        if kind == "reference":
            if entry.reference is None:
                entry.reference, entry.reference_step = record["reference"], record["step"]
        elif kind == "graduation":
            entry.graduation_step, entry.rollouts, entry.rewards = (
                record["step"],
                record["rollouts"],
                record["rewards"],
            )
        else:
            raise ValueError(f"{path}:{number}: unknown kind {kind!r} (expected 'reference' or 'graduation')")
    return {k: q for k, q in questions.items() if q.rollouts or not graduated_only}
