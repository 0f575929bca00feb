"""MMLU-Redux 2.0: MMLU re-annotated, 57 subject configs; Exact on the option letter."""

from __future__ import annotations

from ..spec import ALL_CONFIGS, TaskSpec

MMLU_RD = TaskSpec(
    "MMLU-Rd", "llm", "MMLU-Redux 2.0", "exact+judge", "edinburgh-dawg/mmlu-redux-2.0", "test",  # upstream
    "question", "answer", subset=ALL_CONFIGS, options_field="choices",  # upstream; 57 subject configs
    gold_form="index",  # upstream: mmlu-redux answer is the index into choices
)  # fmt: skip

SPECS = (MMLU_RD,)
