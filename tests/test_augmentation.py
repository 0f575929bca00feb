"""The step-5 seam: `CandidateReformulation` plans exactly what `plan_reformulations` plans, and deals BCQ first."""

from __future__ import annotations

import random

import pytest

from zppo_trl.augmentation import CandidateReformulation, Evidence
from zppo_trl.reformulate import plan_reformulations


def _evidence() -> Evidence:
    return Evidence(
        hard=["q1", "q2", "q3", "q4"],
        teacher_correct={"q1": ["so \\boxed{4}"], "q3": ["\\boxed{9}"]},
        student_wrong={"q1": ["\\boxed{5}", "no box"], "q2": ["\\boxed{7}", "\\boxed{8}"], "q3": ["nothing parsed"], "q4": []},
    )


def test_the_plan_is_plan_reformulations_with_the_same_rng_and_counts_the_hard_questions():
    metrics: dict = {}
    planned = CandidateReformulation().plan(_evidence(), 3, random.Random(0), metrics)
    e = _evidence()
    assert planned == plan_reformulations(e.hard, e.teacher_correct, e.student_wrong, 3, ("bcq", "ncq"), rng=random.Random(0))
    assert [(inst.kind, inst.key) for inst in planned] == [("bcq", "q1"), ("ncq", "q1"), ("ncq", "q2")]
    # q3 has a teacher answer but no parsed wrong student answer: neither kind is possible.
    assert metrics == {"hard": 4, "hard_bcq_possible": 1, "hard_ncq_only": 1, "teacher_success_rate": 0.5}  # 1 BCQ over 2 questions


def test_one_kind_alone_and_the_dealing_order():
    ncq_only = CandidateReformulation(["ncq"])
    assert ncq_only.kinds == ("ncq",)
    assert {inst.kind for inst in ncq_only.plan(_evidence(), 4, random.Random(0), {})} == {"ncq"}
    both = CandidateReformulation(["ncq", "bcq"])
    assert both.kinds == ("bcq", "ncq")  # the paper's order, whatever the config's
    planned = both.plan(_evidence(), 4, random.Random(0), {})
    assert [inst.kind for inst in both.order(planned)] == ["bcq", "ncq", "ncq"]


def test_an_unknown_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="hint"):
        CandidateReformulation(["bcq", "hint"])
