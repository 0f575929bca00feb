"""GPQA-Diamond: 198 graduate-level science questions with four answers; Exact on the option letter.

The upstream columns hold the correct answer and three incorrect ones, so the four are shuffled
at prompt time per (seed, pass, row id) with a SHA-256-seeded generator; the order shown is
recorded under `PRESENTED_OPTIONS` in the request's row, which the scorer reads.
"""

from __future__ import annotations

from ..spec import TaskSpec

_OPTIONS = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")  # upstream

GPQA_D = TaskSpec(
    "GPQA-D", "llm", "GPQA-Diamond", "exact+judge", "Idavidrein/gpqa", "train",  # upstream (only split)
    "Question", "Correct Answer", subset="gpqa_diamond", options_field=_OPTIONS, size=198,  # upstream
    shuffle_options=True,
    gold_form="text",  # upstream: "Correct Answer" text; the letter depends on the prompt's shuffle
)  # fmt: skip

SPECS = (GPQA_D,)
