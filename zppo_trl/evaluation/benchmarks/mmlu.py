"""MMLU: multiple choice over 57 subjects; Exact on the option letter."""

from __future__ import annotations

from ..spec import TaskSpec

MMLU = TaskSpec(
    "MMLU", "llm", "MMLU", "exact+judge", "cais/mmlu", "test",
    "question", "answer", subset="all", options_field="choices",  # upstream
    gold_form="index",  # upstream: cais/mmlu answer is the ClassLabel index
)  # fmt: skip

SPECS = (MMLU,)
