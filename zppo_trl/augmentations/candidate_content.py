"""What a BCQ ``<candidate>`` block shows: the paper's BCQ candidate-content controls.

The paper's appendix on BCQ candidate-content controls runs BCQ on GRPO† with two other contents:
"Boxed-answer-masked masks the boxed span. Final-answer-only drops the reasoning and keeps the
answer." Both keep the BCQ template, the shared compression prompt and the shuffled, anonymised
pair, so a content is a transform of one compressed candidate, applied to both candidates of a
pair after compression and before the block is rendered (neither candidate can be told from the
other by its form). ``bcq_candidate_content`` picks one from `CANDIDATE_CONTENTS`:

- ``full`` (the paper's BCQ): the compressed candidate as the teacher returned it.
- ``boxed_masked`` ("Boxed-answer-masked"): every ``\\boxed{...}`` span of the candidate, nested
  braces included, becomes `BOXED_MASK`, ``\\boxed{[MASKED]}``: the candidate still ends in a boxed
  final answer, as the compression prompt asks, but shows none. Every span, not only the last that
  the grader reads: an earlier box usually holds the same answer. The reasoning is kept as written,
  so an answer it states in words stays visible; the paper masks the boxed span only.
- ``final_answer_only`` ("Final-answer-only"): ``\\boxed{a}`` alone, ``a`` the answer the grader reads
  in the candidate (`zppo_trl.rewards.extract_boxed`: the last box, stripped).

A transform returns None for a candidate it cannot apply to: one with no closed, non-empty boxed
answer (`zppo_trl.rewards.boxed_spans` and ``extract_boxed``; a compression cut at its token cap, or
one that dropped the box). BCQ needs both candidates, so that instance is dropped, as a failed
compression drops it, and counted (``bcq_content_unboxed``). ``full`` never drops one.

This module is pure: no TRL, no trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..rewards import boxed_spans, extract_boxed

__all__ = ["BOXED_MASK", "CANDIDATE_CONTENTS", "CandidateContent", "candidate_content"]

# What a masked box reads: a box, so the candidate keeps its form, with no answer a grader could match.
BOXED_MASK = "\\boxed{[MASKED]}"


@dataclass(frozen=True)
class CandidateContent:
    """One content of a BCQ candidate block: its field value, the name the paper's table prints, and the
    transform of one compressed candidate (None: the candidate has no boxed answer to transform)."""

    name: str
    printed: str | None  # None: the paper's BCQ, whose rows carry no qualifier
    transform: Callable[[str], str | None]


def _full(text: str) -> str:
    return text


def _boxed_masked(text: str) -> str | None:
    spans = boxed_spans(text)
    if not spans or extract_boxed(text) is None:
        return None
    parts, end = [], 0
    for start, stop in spans:
        parts += [text[end:start], BOXED_MASK]
        end = stop
    return "".join(parts) + text[end:]


def _final_answer_only(text: str) -> str | None:
    answer = extract_boxed(text)
    if answer is None or boxed_spans(text) is None:
        return None
    return f"\\boxed{{{answer}}}"


# bcq_candidate_content -> the content (the registry: a new content is one function and one entry).
CANDIDATE_CONTENTS: dict[str, CandidateContent] = {
    content.name: content
    for content in (
        CandidateContent("full", None, _full),
        CandidateContent("boxed_masked", "boxed-answer-masked", _boxed_masked),
        CandidateContent("final_answer_only", "final-answer-only", _final_answer_only),
    )
}


def candidate_content(name: str) -> CandidateContent:
    """The registered content ``name``; a ValueError naming ``bcq_candidate_content`` otherwise."""
    if name not in CANDIDATE_CONTENTS:
        raise ValueError(f"bcq_candidate_content must be one of {list(CANDIDATE_CONTENTS)}, got {name!r}")
    return CANDIDATE_CONTENTS[name]
