"""IMO-AnswerBench: olympiad problems with short answers; Exact."""

from __future__ import annotations

from ..spec import TaskSpec

IMO_AB = TaskSpec(
    "IMO-AB", "llm", "IMO-AnswerBench", "exact+judge", "OpenEvals/IMO-AnswerBench", "train",  # upstream
    "Problem", "Short Answer",  # upstream
)  # fmt: skip

SPECS = (IMO_AB,)
