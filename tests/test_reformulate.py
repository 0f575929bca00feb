import random
from collections import Counter

import pytest

from zppo_trl.reformulate import Reformulation, attach_compressions, augment_limit, plan_reformulations, select_hard


def wrong(*answers):
    return [f"<think>try</think> \\boxed{{{a}}}" if a is not None else "<think>no answer" for a in answers]


def test_select_hard_ranks_ascending_and_caps():
    accuracy = {"a": 0.375, "b": 0.0, "c": 0.5, "d": 0.125, "e": 0.0, "f": 0.875}
    hardest = select_hard(accuracy, limit=10, rng=0)
    assert sorted(hardest[:2]) == ["b", "e"] and hardest[2:] == ["d", "a"]
    assert select_hard(accuracy, limit=3, rng=0)[2] == "d"
    assert select_hard(accuracy, limit=0, rng=0) == []
    assert sorted(select_hard(accuracy, limit=10, threshold=0.125, rng=0)) == ["b", "e"]


def test_select_hard_breaks_ties_uniformly_with_the_steps_rng():
    # Six new questions and two replayed ones, all at r_x = 0, and a cap of 2: the new
    # questions alone could fill it, yet every tied question must be as likely to be picked.
    accuracy = {**{f"new{i}": 0.0 for i in range(6)}, "replay0": 0.0, "replay1": 0.0, "easy": 0.25}
    picks = Counter()
    rng = random.Random(0)
    for _ in range(4000):
        chosen = select_hard(accuracy, limit=2, rng=rng)
        assert len(chosen) == 2 and "easy" not in chosen
        picks.update(chosen)
    for key in accuracy.keys() - {"easy"}:
        assert 0.21 < picks[key] / 4000 < 0.29, (key, picks[key])  # 2/8 each
    # seeded: the same RNG state gives the same choice (every rank holds the same state)
    assert select_hard(accuracy, 2, rng=random.Random(7)) == select_hard(accuracy, 2, rng=random.Random(7))


def test_augment_limit():
    assert augment_limit(384, 0.25) == 96
    assert augment_limit(10, 0.25) == 2
    with pytest.raises(ValueError):
        augment_limit(10, 1.5)


def test_bcq_needs_teacher_and_parsed_wrong_ncq_needs_parsed_wrong():
    hard = ["both", "ncq_only", "unparsed", "teacher_only"]
    teacher = {"both": ["T \\boxed{7}"], "unparsed": ["T \\boxed{1}"], "teacher_only": ["T \\boxed{2}"]}
    student = {"both": wrong(3, None), "ncq_only": wrong(4, 4, 5), "unparsed": wrong(None, None), "teacher_only": []}
    plan = plan_reformulations(hard, teacher, student, limit=10, rng=0)
    assert [(r.kind, r.key) for r in plan] == [("bcq", "both"), ("ncq", "both"), ("ncq", "ncq_only")]
    bcq, ncq_both, ncq = plan
    assert sorted(bcq.candidates) == sorted(["T \\boxed{7}", wrong(3)[0]])  # the unparsed rollout is never drawn
    assert bcq.candidates[bcq.teacher_position] == "T \\boxed{7}"
    assert ncq_both.candidates == tuple(wrong(3)) and ncq_both.wrong_answers == ("3",)
    assert ncq.candidates == tuple(wrong(4, 4, 5))  # every parsed rollout is a candidate
    assert ncq.wrong_answers == ("4", "5")  # distinct answers, first-seen order
    assert ncq.candidate_answers() == ("4", "4", "5")


def test_post_cap_keeps_bcq_when_one_slot_is_left():
    hard = ["q1", "q2", "q3"]
    teacher = {k: [f"T{k} \\boxed{{1}}"] for k in hard}
    student = {k: wrong(2) for k in hard}
    plan = plan_reformulations(hard, teacher, student, limit=3, rng=0)
    assert [(r.kind, r.key) for r in plan] == [("bcq", "q1"), ("ncq", "q1"), ("bcq", "q2")]
    assert len(plan_reformulations(hard, teacher, student, limit=0, rng=0)) == 0


def test_kinds_switch_branches_off():
    hard, teacher, student = ["q"], {"q": ["T \\boxed{1}"]}, {"q": wrong(2)}
    assert [r.kind for r in plan_reformulations(hard, teacher, student, 5, kinds=("ncq",))] == ["ncq"]
    assert [r.kind for r in plan_reformulations(hard, teacher, student, 5, kinds=("bcq",))] == ["bcq"]
    assert plan_reformulations(hard, teacher, student, 5, kinds=()) == []
    with pytest.raises(ValueError, match="hint"):
        plan_reformulations(hard, teacher, student, 5, kinds=("hint",))


def test_bcq_draws_are_uniform_shuffled_and_seeded():
    teacher = {"q": [f"T{i} \\boxed{{9}}" for i in range(4)]}
    student = {"q": wrong(1, 2, 3, 4)}
    plans = [plan_reformulations(["q"], teacher, student, 1, rng=seed)[0] for seed in range(400)]
    assert plan_reformulations(["q"], teacher, student, 1, rng=5) == [plans[5]]
    first = sum(p.teacher_position == 0 for p in plans)
    assert 160 < first < 240  # the teacher's candidate comes first about half the time
    teacher_draws = {p.candidates[p.teacher_position] for p in plans}
    student_draws = {p.candidates[1 - p.teacher_position] for p in plans}
    assert teacher_draws == set(teacher["q"]) and student_draws == set(student["q"])


def test_reformulation_is_immutable():
    r = Reformulation(kind="ncq", key=1, candidates=("x",), wrong_answers=("1",))
    with pytest.raises(AttributeError):
        r.kind = "bcq"


def test_a_cut_off_last_box_is_not_a_parsed_answer():
    # mathruler reads only the last \boxed{: an earlier complete box does not make the
    # rollout parsed, so it is neither an NCQ candidate nor a BCQ student draw.
    cut_off = "\\boxed{3}, or rather \\boxed{\\frac{1}{"
    emptied = "\\boxed{4} then \\boxed{}"
    plan = plan_reformulations(["q"], {"q": ["T \\boxed{9}"]}, {"q": [cut_off, emptied, *wrong(5)]}, limit=5, rng=0)
    bcq, ncq = plan
    assert wrong(5)[0] in bcq.candidates and cut_off not in bcq.candidates
    assert ncq.candidates == tuple(wrong(5)) and ncq.wrong_answers == ("5",)
    assert plan_reformulations(["q"], {"q": ["T \\boxed{9}"]}, {"q": [cut_off, emptied]}, limit=5, rng=0) == []


def test_failed_compressions_drop_an_ncq_candidate_but_a_bcq_instance():
    teacher = {"a": ["T \\boxed{9}"], "b": ["T \\boxed{9}"]}
    student = {"a": wrong(1, 2, 2), "b": wrong(3)}
    plan = plan_reformulations(["a", "b"], teacher, student, limit=4, rng=0)
    assert [(r.kind, r.key) for r in plan] == [("bcq", "a"), ("ncq", "a"), ("bcq", "b"), ("ncq", "b")]
    #            bcq a: both ok     ncq a: middle one failed       bcq b: one failed   ncq b: all failed
    compressed = ["s1", "s2", "c1", None, "c3", "s3", None, None]
    kept, failed = attach_compressions(plan, compressed)
    assert failed == 3
    assert [(inst.kind, inst.key) for inst, _ in kept] == [("bcq", "a"), ("ncq", "a")]
    (bcq, bcq_texts), (ncq, ncq_texts) = kept
    assert bcq == plan[0] and bcq_texts == ("s1", "s2")
    # the NCQ instance keeps its wrong-answer list (from the rollouts) and the candidates that compressed
    assert ncq_texts == ("c1", "c3") and ncq.wrong_answers == ("1", "2")
    assert ncq.candidates == (plan[1].candidates[0], plan[1].candidates[2])
    assert attach_compressions(plan, ["x"] * 8) == ([(inst, ("x",) * len(inst.candidates)) for inst in plan], 0)
    with pytest.raises(ValueError, match="7 compressions for 8 candidates"):
        attach_compressions(plan, ["x"] * 7)
