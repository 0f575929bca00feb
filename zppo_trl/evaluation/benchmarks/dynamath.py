"""DynaMath: ten generated variants of each seed question; a seed counts only when all its
variants are right (worst case over variants)."""

from __future__ import annotations

import re

from ..spec import TaskSpec

_I = re.IGNORECASE

DIRECTIVES = (
    # DynaMath/DynaMath_Sample `question`: the generator's queries embed the answer type
    # (DynaMath/DynaMath question generators, e.g. Q01 "What is the period of this function?
    # Answer the question with a floating-point number.").
    (re.compile(r"\s*Answer\s+the\s+question\s+with\s+an?\s+(?:[\w-]+\s+){0,3}?(?:number|integer|value)\s*\.?", _I),
     ""),
)  # fmt: skip

DYNAM = TaskSpec(
    "DynaM", "vlm", "DynaMath", "exact+judge", "DynaMath/DynaMath_Sample",
    tuple(f"sample_variant{i}" for i in range(1, 11)),  # upstream: one split per variant
    "question", "ground_truth", image_field="decoded_image",  # upstream
    aggregation="worst_case_variants", group_field="id", size=501, extra_fields=("answer_type",),
    directives=DIRECTIVES,
)  # fmt: skip

SPECS = (DYNAM,)
