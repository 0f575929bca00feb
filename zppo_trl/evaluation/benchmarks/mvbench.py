"""MVBench: twenty temporal video tasks, multiple choice; Rule: MVBench's own option matching
(lmms-eval's `mcq_acc`) on the boxed span."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..metrics import LETTERS, as_list, require
from ..spec import ALL_CONFIGS, TaskSpec

# lmms-eval `lmms_eval/tasks/mvbench/utils.py` (`mcq_acc`, unchanged from c7eaef37 to HEAD 75571cf):
# the VQA-style punctuation pass, then the first standalone A-E letter.
_MVB_PUNCT = [";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!"]
_MVB_COMMA_NUMBER = re.compile(r"(\d)(,)(\d)")
# Upstream's period pattern is "(?!<=\d)(\.)(?!\d)": the intended look-behind is a look-ahead
# that always passes, so it strips every period not followed by a digit; and it passes re.UNICODE
# positionally as sub()'s count, so at most 32 periods go. Both kept.
_MVB_PERIOD = re.compile(r"\.(?!\d)")
_MVB_OPTION_PREFIX = re.compile(r"([A-E])\.\s*(.+)", re.IGNORECASE)
_MVB_LETTER = re.compile(r"\b([A-E])\b", re.IGNORECASE)


def _mvbench_normalise(text: str) -> str:
    """The answer key MVBench compares: an upper-case A-E letter, else the cleaned lower-cased text."""
    match = _MVB_OPTION_PREFIX.fullmatch(text.strip())  # "B. cat" -> "B"
    if match:
        return match.group(1).upper()
    original = text.replace("\n", " ").replace("\t", " ").strip()
    cleaned = original
    joined = bool(_MVB_COMMA_NUMBER.search(original))
    for mark in _MVB_PUNCT:  # the test reads the original text, the edit the running one (upstream)
        glue = joined or (mark + " " in original or " " + mark in original)
        cleaned = cleaned.replace(mark, "" if glue else " ")
    cleaned = _MVB_PERIOD.sub("", cleaned, count=32)
    cleaned = cleaned.strip("'").strip('"').strip(")").strip("(").strip().lower()
    # Quirk kept: after lower-casing, any standalone a-e word counts, so the article in
    # "a cat, so B" reads as "A".
    letter = _MVB_LETTER.search(cleaned)
    return letter.group(1).upper() if letter else cleaned


def mvbench_rule(extraction: str, row: Mapping[str, Any], spec: TaskSpec | None = None) -> tuple[bool, str]:
    """MVBench's `mcq_acc`: the gold letter is the candidate equal to ``answer``; both sides normalised, then equal."""
    spec = spec or MVBENCH
    candidates = [str(candidate) for candidate in as_list(require(spec, row, "candidates"))]
    answer = str(require(spec, row, "answer"))
    if answer not in candidates:
        raise ValueError(f"{spec.name}: row 'answer' {answer!r} is not among 'candidates'")
    gold = LETTERS[candidates.index(answer)]
    return _mvbench_normalise(extraction) == _mvbench_normalise(gold), "mvbench:mcq_acc"


def mvbench_gold(spec: TaskSpec, row: Mapping[str, Any]) -> str:
    """The gold letter: the position of ``answer`` among ``candidates`` (the answer itself if absent)."""
    candidates = [str(c) for c in as_list(require(spec, row, "candidates"))]
    answer = str(require(spec, row, "answer"))
    return LETTERS[candidates.index(answer)] if answer in candidates else answer


MVBENCH = TaskSpec(
    "MVBench", "video", "MVBench", "rule+judge", "OpenGVLab/MVBench", "train",  # upstream
    "question", "answer", subset=ALL_CONFIGS, options_field="candidates", video_field="video",  # upstream
    rule=mvbench_rule,
    rule_gold=mvbench_gold,
)  # fmt: skip

SPECS = (MVBENCH,)
