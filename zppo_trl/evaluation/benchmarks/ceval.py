"""C-Eval (validation): Chinese multiple-choice exams over 52 subjects; Exact on the option letter."""

from __future__ import annotations

from ..spec import ALL_CONFIGS, TaskSpec

CEVAL = TaskSpec(
    "CEval", "llm", "C-Eval", "exact+judge", "ceval/ceval-exam", "val",
    "question", "answer", subset=ALL_CONFIGS, options_field=("A", "B", "C", "D"),  # upstream; 52 subject configs
    gold_form="letter",
)  # fmt: skip

SPECS = (CEVAL,)
