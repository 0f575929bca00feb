"""MathVerse: math diagrams in several versions (Text Dominant ... Vision Only, Text Only); Exact.

Vision Only rows leave the question column empty (the question is drawn in the diagram); Text
Only rows have no image.
"""

from __future__ import annotations

import re

from ..spec import TaskSpec

_I = re.IGNORECASE
_EG_LIST = r"(?:[A-E](?:,\s*[A-E])*|-?\d+(?:\.\d+)?(?:,\s*-?\d+(?:\.\d+)?)*)"

DIRECTIVES = (
    # MathVerse: the directives live in `query_wo` / `query_cot` ("Please directly answer the
    # question and provide the correct option letter, e.g., A, B, C, D.\nQuestion: ..."; Vision
    # Only: "According to the question shown in the image, please ..."), not in `question`,
    # which this harness reads; stripped in case a mirror's question column holds a query.
    (re.compile(r"\s*(?:According\s+to\s+the\s+question\s+shown\s+in\s+the\s+image,\s*)?Please\s+"
                r"(?:directly\s+answer\s+the\s+question"
                r"|first\s+conduct\s+reasoning,\s*and\s+then\s+answer\s+the\s+question)"
                rf"\s+and\s+provide\s+the\s+(?:correct\s+option\s+letter|final\s+value),\s*e\.g\.,\s*{_EG_LIST}"
                r"(?:,\s*at\s+the\s+end)?\s*\.\s*(?:Question:\s*)?", _I), ""),
)  # fmt: skip

MVERSE = TaskSpec(
    "MVerse", "vlm", "MathVerse", "exact+judge", "CaraJ/MathVerse-lmmseval", "testmini",
    "question", "answer", subset="testmini", image_field="image",  # upstream
    extra_fields=("problem_version", "question_type"),
    directives=DIRECTIVES,
    image_optional=True,  # the Text Only version has no image
    question_may_be_image_only=True,  # Vision Only: the question is drawn in the diagram
)  # fmt: skip

SPECS = (MVERSE,)
