"""EmbSpatial-Bench: multiple-choice spatial questions on embodied scenes; Exact on the option letter."""

from __future__ import annotations

import re

from ..spec import TaskSpec

_I = re.IGNORECASE

DIRECTIVES = (
    # lmms-eval embspatial pre_prompt ("Note: You only need to respond with A, B, C, D without
    # providing any additional information.").
    (re.compile(r"\s*Note:\s*You\s+only\s+need\s+to\s+respond\s+with\s+A,\s*B,\s*C,\s*D\s+without\s+"
                r"providing\s+any\s+additional\s+information\s*\.?", _I), ""),
)  # fmt: skip

EMBSP = TaskSpec(
    "EmbSp", "vlm", "EmbSpatial-Bench", "exact+judge", "FlagEval/EmbSpatial-Bench", "test",  # upstream
    "question", "answer", options_field="answer_options", image_field="image",  # upstream
    directives=DIRECTIVES,
    gold_form="index",  # assumption: FlagEval/EmbSpatial-Bench answer indexes answer_options
)  # fmt: skip

SPECS = (EMBSP,)
