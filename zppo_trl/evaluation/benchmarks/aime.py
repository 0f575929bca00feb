"""AIME 2025 and AIME 2026: the American Invitational Mathematics Examination's 30 problems a
year, integer answers; Exact."""

from __future__ import annotations

from ..spec import TaskSpec

AIME25 = TaskSpec(
    "AIME25", "llm", "AIME 2025", "exact+judge", "opencompass/AIME2025", "test",  # upstream
    "question", "answer", subset=("AIME2025-I", "AIME2025-II"), size=30,  # upstream
)  # fmt: skip

AIME26 = TaskSpec(
    "AIME26", "llm", "AIME 2026", "exact+judge", "MathArena/aime_2026", "train",  # upstream
    "problem", "answer", size=30,  # upstream
)  # fmt: skip

SPECS = (AIME25, AIME26)
