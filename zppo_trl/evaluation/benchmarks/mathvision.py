"""MathVision (MATH-Vision): competition math with images; multiple-choice or free-form; Exact."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..metrics import choice_gold, gold_field, scored_options
from ..spec import TaskSpec


def mathvision_gold(spec: TaskSpec, row: Mapping[str, Any]) -> str:
    """The option letter on a multiple-choice row; the value verbatim on a free-form row (no options)."""
    gold = gold_field(spec, row)
    if not scored_options(spec, row):
        return str(gold).strip()  # free-form MathVision row
    return choice_gold(spec, row, gold)


MVISION = TaskSpec(
    "MVision", "vlm", "MathVision", "exact+judge", "MathLLMs/MathVision", "test",  # assumption: full test set
    "question", "answer", options_field="options", image_field="decoded_image",  # upstream
    gold_form="letter",  # upstream: letter when options is non-empty, else a value
    exact_gold=mathvision_gold,
)  # fmt: skip

SPECS = (MVISION,)
