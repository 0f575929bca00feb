"""MathVista (testmini): math reasoning in visual contexts; Rule: MathVista's own answer
normalisation and equality, on the boxed span."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..metrics import LETTERS, as_list, levenshtein, require
from ..spec import TaskSpec

_I = re.IGNORECASE

DIRECTIVES = (
    # MathVista: the hint line is in `query` ("Hint: Please answer the question requiring an
    # integer answer and provide the final value, e.g., 1, 2, 3, at the end.\nQuestion: ..."),
    # not in `question`; stripped in case a mirror's question column holds the query.
    (re.compile(r"\s*Hint:\s*Please\s+answer\s+the\s+question\s+[^\n]*?at\s+the\s+end\.\s*(?:Question:\s*)?", _I), ""),
)


def mathvista_rule(extraction: str, row: Mapping[str, Any], spec: TaskSpec | None = None) -> tuple[bool, str]:
    """MathVista's answer normalisation and equality; returns (correct, branch).

    Follows lupantech/MathVista `evaluation/calculate_score.py` (`normalize_extracted_answer`,
    `safe_equal`, HEAD 53d5258): multi_choice: a ``(X)`` letter is pulled out, a letter in range
    picks its choice, anything else picks the Levenshtein-closest choice (first on ties); integer:
    ``str(int(float(x)))`` (truncates); float: ``str(round(float(x), precision))``; list: ``str(x)``.
    The result must equal the gold string exactly. The free_form text case is unreachable
    upstream (no branch sets the result); we pass the extraction through, as its first version did.
    """
    spec = spec or MVISTA
    gold = str(require(spec, row, "answer"))
    question_type = require(spec, row, "question_type")
    answer_type = require(spec, row, "answer_type")
    extraction = extraction.strip()
    if question_type == "multi_choice":
        choices = [str(choice) for choice in as_list(require(spec, row, "choices"))]
        if not choices:
            raise ValueError(f"{spec.name}: multi_choice row has no 'choices'")
        letters = re.findall(r"\(([a-zA-Z])\)", extraction)
        if letters:
            extraction = letters[0].upper()
        if extraction in LETTERS[: len(choices)]:
            prediction = choices[LETTERS.index(extraction)]
        else:
            distances = [levenshtein(extraction, choice) for choice in choices]
            prediction = choices[distances.index(min(distances))]
        return prediction == gold, "mathvista:multi_choice"
    if answer_type == "integer":
        try:
            prediction = str(int(float(extraction)))
        except (ValueError, OverflowError):
            prediction = None
    elif answer_type == "float":
        try:
            precision = int(float(require(spec, row, "precision")))
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{spec.name}: row 'precision' {row.get('precision')!r} is not a number") from None
        try:
            prediction = str(round(float(extraction), precision))
        except (ValueError, OverflowError):
            prediction = None
    else:  # "list" (str(x) of a string is itself) and free_form "text"
        prediction = extraction
    return prediction == gold, f"mathvista:{answer_type}"


MVISTA = TaskSpec(
    "MVista", "vlm", "MathVista", "rule+judge", "AI4Math/MathVista", "testmini",
    "question", "answer", options_field="choices", image_field="decoded_image",  # upstream
    extra_fields=("question_type", "answer_type", "precision", "unit"),
    directives=DIRECTIVES,
    rule=mathvista_rule,
)  # fmt: skip

SPECS = (MVISTA,)
