"""AI2D (AI2 Diagrams): multiple-choice questions on science diagrams; Exact on the option letter."""

from __future__ import annotations

from ..spec import TaskSpec

AI2D = TaskSpec(
    "AI2D", "vlm", "AI2 Diagrams", "exact+judge", "lmms-lab/ai2d", "test",  # upstream (only split)
    "question", "answer", options_field="options", image_field="image",  # upstream
    gold_form="index",  # upstream: lmms-lab/ai2d answer is the option index
)  # fmt: skip

SPECS = (AI2D,)
