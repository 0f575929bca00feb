"""VisualPuzzles: multiple-choice puzzles on algorithmic, analogical, deductive, inductive and
spatial reasoning; Exact on the option letter."""

from __future__ import annotations

import re

from ..spec import TaskSpec

_I = re.IGNORECASE

DIRECTIVES = (
    # VisualPuzzles: lmms-eval VisualPuzzles COT_PROMPT's first sentence (the rest is generic).
    (re.compile(r"\s*Solve\s+the\s+multiple-choice\s+question\s+and\s+then\s+answer\s+with\s+the\s+option\s+"
                r"letter\s+from\s+the\s+given\s+choices\s*\.?", _I), ""),
)  # fmt: skip

VISP = TaskSpec(
    "VisP", "vlm", "VisualPuzzles", "exact+judge", "neulab/VisualPuzzles", "train",  # upstream
    "question", "answer", options_field="options", image_field="image",  # upstream
    directives=DIRECTIVES,
    gold_form="letter",
)  # fmt: skip

SPECS = (VISP,)
