"""MMLU-Pro: harder multiple choice with up to ten options; Exact on the option letter."""

from __future__ import annotations

from ..spec import TaskSpec

MMLU_PRO = TaskSpec(
    "MMLU-Pro", "llm", "MMLU-Pro", "exact+judge", "TIGER-Lab/MMLU-Pro", "test",  # upstream
    "question", "answer", options_field="options",  # upstream
    gold_form="letter",  # upstream: answer is the option letter
)  # fmt: skip

SPECS = (MMLU_PRO,)
