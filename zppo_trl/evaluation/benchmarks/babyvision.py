"""BabyVision: multiple-choice and fill-in-the-blank visual questions; Exact.

Two answer columns, ``choiceAns`` and ``blankAns``; the row's ``ansType`` says which is filled.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..metrics import choice_gold, gold_field, require
from ..spec import TaskSpec

_I = re.IGNORECASE

DIRECTIVES = (
    # lmms-eval babyvision.yaml post_prompt ("Think about the question and give your final answer
    # in \boxed{Answer} format."), should a prepared copy carry it.
    (re.compile(r"\s*(?:Think\s+about\s+the\s+question\s+and\s+)?give\s+your\s+final\s+answer\s+in\s+"
                r"\\boxed\{Answer\}\s+format\s*\.?", _I), ""),
)  # fmt: skip


def babyvision_gold(spec: TaskSpec, row: Mapping[str, Any]) -> str:
    """The gold of the column ``ansType`` names: a blank answer verbatim, a choice as its letter."""
    if row.get("ansType") is not None:  # ansType names the filled column
        blank = not str(row["ansType"]).lower().startswith("choice")
        gold = require(spec, row, "blankAns" if blank else "choiceAns")
        if blank:
            return str(gold).strip()
    else:
        gold = gold_field(spec, row)
    return choice_gold(spec, row, gold)


BABYV = TaskSpec(
    "BabyV", "vlm", "BabyVision", "exact+judge", "UnipatAI/BabyVision", "train",  # upstream
    "question", ("choiceAns", "blankAns"), options_field="options", image_field="image",  # upstream
    extra_fields=("ansType",),  # upstream: says which answer column is filled
    directives=DIRECTIVES,
    gold_form="index",  # assumption: choiceAns is an index or a letter (both handled); blankAns is verbatim
    exact_gold=babyvision_gold,
)  # fmt: skip

SPECS = (BABYV,)
