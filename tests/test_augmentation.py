"""The step-5 seam: the registry builds each kind's augmentation, `CandidateReformulation` plans exactly what
`plan_reformulations` plans, and deals BCQ first; and which questions, and which rollouts of them, the Hint, Prefix,
Correction-SFT and Error-reflection-SFT controls plan on (the paper's shared augmentation-branch convention and
its algorithms for those rows). What they then send the teacher and keep of its replies is checked against a real
teacher in tests/test_comparison_rows.py."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from zppo_trl.augmentations import (
    AUGMENTATION_KINDS,
    AUGMENTATIONS,
    CandidateReformulation,
    CorrectionTargets,
    Evidence,
    HintedGuidance,
    ReflectionTargets,
    ResponsePrefix,
    TeacherHint,
    check_kinds,
    leaks_answer,
    make_augmentation,
)
from zppo_trl.prompts import CORRECT_TAG
from zppo_trl.reformulate import plan_reformulations


def _evidence() -> Evidence:
    return Evidence(
        hard=["q1", "q2", "q3", "q4"],
        teacher_correct={"q1": ["so \\boxed{4}"], "q3": ["\\boxed{9}"]},
        student_wrong={
            "q1": ["\\boxed{5}", "no box"],
            "q2": ["\\boxed{7}", "\\boxed{8}"],
            "q3": ["nothing parsed"],
            "q4": [],
        },
    )


def test_the_plan_is_plan_reformulations_with_the_same_rng_and_counts_the_hard_questions():
    metrics: dict = {}
    planned = CandidateReformulation().plan(_evidence(), 3, random.Random(0), metrics)
    e = _evidence()
    assert planned == plan_reformulations(
        e.hard, e.teacher_correct, e.student_wrong, 3, ("bcq", "ncq"), rng=random.Random(0)
    )
    assert [(inst.kind, inst.key) for inst in planned] == [("bcq", "q1"), ("ncq", "q1"), ("ncq", "q2")]
    # q3 has a teacher answer but no parsed wrong student answer: neither kind is possible.
    assert metrics == {
        "hard": 4,
        "hard_bcq_possible": 1,
        "hard_ncq_only": 1,
        "teacher_success_rate": 0.5,
    }  # 1 BCQ over 2 questions


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


def _all_right(keys, texts):
    """A grader that verifies every response."""
    return [[True] * len(t) for t in texts]


def _tokenizer(text, add_special_tokens=False):
    return {"input_ids": list(range(len(text.split())))}


def test_the_registry_builds_each_kind_from_what_the_trainer_offers():
    assert AUGMENTATION_KINDS == ("bcq", "ncq", "hint", "prefix", "correction", "reflection") == tuple(AUGMENTATIONS)
    hooks = dict(question_of=lambda key: "q", teacher_chat=lambda key, text: [], grade=_all_right)
    assert make_augmentation([]) is None  # GRPO†/GRPO
    zppo = make_augmentation(["ncq", "bcq"])
    assert type(zppo) is CandidateReformulation and zppo.kinds == ("bcq", "ncq")
    hint = make_augmentation(["hint"], answer_of={"q1": "4"}.get)
    assert type(hint) is TeacherHint and hint.answer_of("q1") == "4"
    prefix = make_augmentation(["prefix"], prefix_fraction=0.25, tokenizer=_tokenizer)
    assert type(prefix) is ResponsePrefix and prefix.prefix_ids("a b c d e f g h") == (0, 1)
    for kind, cls in (("correction", CorrectionTargets), ("reflection", ReflectionTargets)):
        built = make_augmentation([kind], **hooks)
        assert type(built) is cls and built.kinds == (kind,) and built.supervised
        assert built.summed_metrics == (f"{kind}_rejected",)
    assert not zppo.supervised and not make_augmentation(["correction"], **hooks).needs.teacher_samples
    # only the augmentation knows the condition its checkpoint is evaluated under (the trainer records it)
    assert make_augmentation(["correction"], **hooks).evaluation_condition == CORRECT_TAG == "<correct>"
    others = [zppo, hint, prefix, make_augmentation(["reflection"], **hooks)]
    assert all(augmentation.evaluation_condition is None for augmentation in others)


def test_a_kind_without_the_inputs_it_needs_is_refused_by_name():
    with pytest.raises(ValueError, match="tokenizer"):
        make_augmentation(["prefix"])
    with pytest.raises(ValueError, match="the correction control needs question_of, teacher_chat and grade"):
        make_augmentation(["correction"], question_of=lambda key: "q")
    with pytest.raises(ValueError, match="alpha"):
        make_augmentation(["prefix"], prefix_fraction=1.0, tokenizer=_tokenizer)
    with pytest.raises(ValueError, match="the Hint control needs answer_of"):
        make_augmentation(["hint"])


@pytest.mark.parametrize(
    "hint, gold",
    [
        ("So x = 2.", "2"),  # a short left-hand side and the sentence's full stop are not part of the answer
        ("The count is $2$, as drawn.", "2"),  # inline math delimiters separate tokens
        ("The ratio is $\\dfrac{1}{2}$.", "\\frac{1}{2}"),  # LaTeX gold, \dfrac written for \frac
        ("Half of it: 1/2 of the area.", "\\frac{1}{2}"),  # a/b is \frac{a}{b} for the grader too
        ("Take 0.5 of the total.", "\\frac{1}{2}"),
        ("The value \\( x^2 + 1 \\) follows.", "x^2+1"),  # spacing inside the expression does not matter
        ("The angle is 30^\\circ.", "30"),  # degree signs stripped as the grader's retry strips them
        ("About 45% of it.", "45\\%"),
        ("The point (1, 2) lies on it.", "(1,2)"),
    ],
)
def test_a_hint_that_states_the_gold_answer_leaks(hint, gold):
    assert leaks_answer(hint, gold)


@pytest.mark.parametrize(
    "hint, gold",
    [
        ("There are 12 apples.", "2"),  # "2" inside "12": only whole tokens match
        ("Multiply by 2.5 first.", "2"),
        ("Square it: x^2 + 1.", "2"),
        ("The ratio is \\frac{1}{2}.", "2"),
        ("It is -2 here.", "2"),
        ("Work out the arithmetic one operation at a time.", "42"),
        ("The ratio is \\frac{1}{3}.", "\\frac{1}{2}"),
        ("Anything at all.", "   "),  # an empty gold states nothing
    ],
)
def test_a_hint_that_does_not_state_the_gold_answer_does_not_leak(hint, gold):
    assert not leaks_answer(hint, gold)


def test_the_hint_leak_rate_counts_accepted_hints_that_state_the_gold():
    hint = TeacherHint(answer_of={"q1": "2"}.get)
    instances = [
        HintedGuidance("hint", "q1", "\\boxed{2}", "x = 2 is close.", leaked=True),
        HintedGuidance("hint", "q2", "\\boxed{5}", "Count the sides.", leaked=False),
        HintedGuidance("hint", "q3", "\\boxed{7}", "Add them.", leaked=False),
    ]
    counts = hint.audit_counts(instances, ["rollout"] * 12, group_size=4)
    assert counts == {"hints": 3.0, "leaked": 1.0}
    # the trainer sums the counts over ranks before the rate: 1 + 2 leaked of 3 + 5 accepted
    assert hint.audit_metrics({"hints": 8.0, "leaked": 3.0}) == {"hint_leaked": 3.0, "hint_leak_rate": 3 / 8}
    assert hint.audit_metrics(hint.audit_counts([], [], 4)) == {"hint_leaked": 0.0, "hint_leak_rate": 0.0}


@pytest.mark.parametrize("kinds", [["bcq", "hint"], ["hint", "prefix"], ["correction", "bcq"], ["reflection", "hint"]])
def test_kinds_of_different_families_do_not_combine(kinds):
    with pytest.raises(
        ValueError, match=r"augmentations .* mix kinds that do not combine: use a subset of \[bcq, ncq\]"
    ):
        check_kinds(kinds)


@pytest.mark.parametrize("kinds", [["bcq", "bcq"], ["bcq", "tip"]])
def test_repeated_or_unknown_kinds_are_refused(kinds):
    with pytest.raises(ValueError, match="augmentations must be distinct kinds from"):
        check_kinds(kinds)


def test_every_family_alone_and_bcq_with_ncq_are_valid():
    for kinds in ([], ["bcq"], ["ncq"], ["bcq", "ncq"], ["hint"], ["prefix"], ["correction"], ["reflection"]):
        assert check_kinds(kinds) == tuple(kinds)


def test_the_augmentations_are_on_no_import_cycle():
    """No module of zppo_trl.augmentations (nor config, which imports it) reaches itself again through imports,
    function-level ones included."""
    import ast
    from pathlib import Path

    import zppo_trl

    root = Path(zppo_trl.__file__).parent
    modules = {".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in root.rglob("*.py")}  # fmt: skip
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1] if node.level else []
                target = ".".join([*parts, *([node.module] if node.module else [])])
                for alias in node.names:  # `from .pkg import module` imports the module, else the package
                    found = next((c for c in (f"{target}.{alias.name}", target) if c in modules), None)
                    if found and found != name:
                        graph[name].add(found)
            elif isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in modules and a.name != name)
    assert graph["zppo_trl.augmentations"] >= {
        f"zppo_trl.augmentations.{m}" for m in ("base", "candidates", "guidance", "targets")
    }
    for start in [name for name in modules if name.startswith("zppo_trl.augmentations")] + ["zppo_trl.config"]:
        seen, todo = set(), list(graph[start])
        while todo:
            name = todo.pop()
            assert name != start, f"{start} imports itself back through {sorted(seen)}"
            if name not in seen:
                seen.add(name)
                todo.extend(graph[name])


# ---------------------------------------------------------------------------------------------------------------
# The controls' selection (the paper's "shared augmentation-branch convention" and its Hint, Prefix,
# Correction-SFT and Error-reflection-SFT algorithms). Step 4 hands every augmentation the pre-capped hard
# questions, hardest first (`select_hard`: plain accuracy below hard_threshold, at most augment_fraction x
# |X_new|; pinned in tests/test_reformulate.py and, as the trainer applies it, in tests/test_comparison_rows.py),
# the graded-correct teacher rollouts and the wrong student rollouts of each. These tests pin what each control
# plans from that.


def _rollout(answer: str, note: str = "") -> str:
    return f"<think> Let me compute.{note} </think> \\boxed{{{answer}}}"


def _selection_evidence() -> Evidence:
    """Five pre-capped hard questions, hardest first, and one easy question that is not among them.

    h0's teacher rollouts were all graded wrong (an empty list) and h3's teacher sampled nothing (no entry):
    neither has a graded-correct teacher rollout. Every question has wrong student rollouts, "easy" included
    (one of its eight rollouts was wrong), and "easy" has a correct teacher rollout too.
    """
    hard = ["h0", "h1", "h2", "h3", "h4"]
    return Evidence(
        hard=hard,
        teacher_correct={
            "h0": [],
            "h1": [_rollout("1"), _rollout("1", " Carefully.")],
            "h2": [_rollout("2")],
            "h4": [_rollout("4")],
            "easy": [_rollout("9")],
        },
        student_wrong={key: [_rollout("0", f" {key} wrong"), f"{key}: no answer"] for key in [*hard, "easy"]},
    )


def _guidance(kind: str):
    if kind == "prefix":
        return make_augmentation([kind], tokenizer=_tokenizer)
    return make_augmentation([kind], answer_of=lambda key: "7")  # the leak count's gold answer; plans never read it


def _supervised(kind: str):
    return make_augmentation([kind], question_of=lambda key: "q", teacher_chat=lambda key, text: [], grade=_all_right)


@pytest.mark.parametrize("kind", ["hint", "prefix"])
def test_hint_and_prefix_plan_the_hardest_pre_capped_questions_that_have_a_correct_teacher_rollout(kind):
    """Pins the Hint/Prefix selection of the paper's alg:hint and alg:prefix: of the pre-capped hard questions,
    hardest first, each with at least one graded-correct teacher rollout (N_x > 0) gets one instance, at most
    ``limit`` of them, and a question without one contributes nothing (no other question takes its slot).

    Fails if a question with no correct teacher rollout (h0: all graded wrong; h3: none sampled) were planned,
    if a question outside the pre-capped hard list ("easy") were planned, if the walk were not hardest first
    (limit 2 must keep h1 and h2, not h4), if a question got more than one instance (h1 has two correct
    rollouts), or if the cap were ignored.
    """
    augmentation = _guidance(kind)
    metrics: dict = {}
    assert [(i.kind, i.key) for i in augmentation.plan(_selection_evidence(), 5, random.Random(0), metrics)] == [
        (kind, "h1"),
        (kind, "h2"),
        (kind, "h4"),
    ]
    assert metrics == {"hard": 5, f"hard_{kind}_possible": 3}
    assert [i.key for i in augmentation.plan(_selection_evidence(), 2, random.Random(0), {})] == ["h1", "h2"]
    assert augmentation.plan(_selection_evidence(), 0, random.Random(0), {}) == []


def test_correction_sft_plans_every_pre_capped_hard_question_hardest_first_without_teacher_rollouts():
    """Pins the Correction-SFT selection (the paper's alg:correctionsft): every pre-capped hard question, hardest
    first, gets one corrector call, at most ``limit``; the row samples no teacher rollouts, so a question the
    teacher never solved is planned like any other.

    Fails if Correction-SFT required a correct teacher rollout (h0 and h3 would drop out), planned a question
    outside the hard list ("easy" has a wrong rollout too), walked in another order (limit 2 must keep h0, h1),
    or ignored the cap.
    """
    correction = _supervised("correction")
    assert not correction.needs.teacher_samples and correction.needs.teacher_requests
    metrics: dict = {}
    planned = correction.plan(_selection_evidence(), 5, random.Random(0), metrics)
    assert [(i.kind, i.key) for i in planned] == [("correction", f"h{i}") for i in range(5)]
    assert metrics == {"hard": 5}
    assert [i.key for i in correction.plan(_selection_evidence(), 2, random.Random(0), {})] == ["h0", "h1"]
    assert correction.plan(_selection_evidence(), 0, random.Random(0), {}) == []
    # a hard question without a wrong rollout (every rollout unscorable and counted wrong is the only way a hard
    # question has none; here its list is empty) gives no call
    evidence = _selection_evidence()
    no_wrong = Evidence(evidence.hard, evidence.teacher_correct, {**evidence.student_wrong, "h0": []})
    assert [i.key for i in correction.plan(no_wrong, 5, random.Random(0), {})] == ["h1", "h2", "h3", "h4"]


def test_error_reflection_sft_plans_the_hardest_pre_capped_questions_that_have_a_correct_teacher_draft():
    """Pins the Error-reflection-SFT selection (the paper's alg:errorreflectionsft): of the pre-capped hard
    questions, hardest first, those with a graded-correct teacher draft (N_x > 0) each get one revision call,
    at most ``limit``.

    Fails if a question whose drafts were all graded wrong (h0) or that has none (h3) were revised, if "easy"
    (not hard) were planned, if the walk were not hardest first (limit 2 keeps h1, h2), or if the cap were
    ignored.
    """
    reflection = _supervised("reflection")
    assert reflection.needs.teacher_samples  # the G_T drafts are sampled and graded in steps 2 and 4
    metrics: dict = {}
    planned = reflection.plan(_selection_evidence(), 5, random.Random(0), metrics)
    assert [(i.kind, i.key) for i in planned] == [("reflection", key) for key in ("h1", "h2", "h4")]
    assert metrics == {"hard": 5, "hard_reflection_possible": 3}
    assert [i.key for i in reflection.plan(_selection_evidence(), 2, random.Random(0), {})] == ["h1", "h2"]
    assert reflection.plan(_selection_evidence(), 0, random.Random(0), {}) == []


def _draws(augmentation, evidence: Evidence, key: str, field: str, times: int = 3000) -> Counter:
    """How often each text was drawn as ``field`` of ``key``'s instance over ``times`` plans from one RNG."""
    rng = random.Random(0)
    counts: Counter = Counter()
    for _ in range(times):
        (instance,) = [i for i in augmentation.plan(evidence, len(evidence.hard), rng, {}) if i.key == key]
        counts[getattr(instance, field)] += 1
    return counts


def _three_of_each() -> Evidence:
    teacher = [_rollout("5", f" Route {n}.") for n in range(3)]
    student = [_rollout("6", f" Slip {n}.") for n in range(3)] + ["I give up."]
    return Evidence(hard=["q"], teacher_correct={"q": teacher}, student_wrong={"q": student})


@pytest.mark.parametrize("kind", ["hint", "prefix"])
def test_hint_and_prefix_guide_with_one_correct_teacher_rollout_drawn_uniformly(kind):
    """Pins what guides the Hint and Prefix groups (alg:hint, alg:prefix: "select one correct response uniformly";
    the hint generator reads that response only): exactly one of the question's graded-correct teacher
    rollouts, each equally likely, and never a student rollout.

    Fails if the instance carried a student rollout, more than one rollout, or a fixed one (the first, the
    last) instead of a uniform draw: each of the three must come up about a third of the time.
    """
    evidence = _three_of_each()
    counts = _draws(_guidance(kind), evidence, "q", "teacher_response")
    assert set(counts) == set(evidence.teacher_correct["q"])  # only correct teacher rollouts, each a single text
    for text in evidence.teacher_correct["q"]:
        assert 0.29 < counts[text] / 3000 < 0.38, counts


def test_correction_sft_corrects_one_wrong_student_rollout_drawn_uniformly():
    """Pins the rollout Correction-SFT sends the corrector (alg:correctionsft: "select one wrong rollout
    uniformly"): one of the question's wrong student rollouts, each equally likely, unparsable ones included
    (no parse filter), and never a teacher rollout; it carries no other attempt.

    Fails if the source were a teacher rollout, a fixed wrong rollout, or only the parsable ones (the fourth,
    "I give up.", must come up about a quarter of the time).
    """
    evidence = _three_of_each()
    counts = _draws(_supervised("correction"), evidence, "q", "source")
    assert set(counts) == set(evidence.student_wrong["q"])
    for text in evidence.student_wrong["q"]:
        assert 0.21 < counts[text] / 3000 < 0.29, counts
    (instance,) = _supervised("correction").plan(evidence, 1, random.Random(0), {})
    assert instance.attempts == ()


def test_error_reflection_sft_revises_one_correct_draft_drawn_uniformly_with_every_wrong_rollout_in_full():
    """Pins what Error-reflection-SFT sends the refiner (alg:errorreflectionsft and its paragraph): one of the
    question's graded-correct teacher drafts, each equally likely (a wrong draft is never revised), with all
    K_x wrong student rollouts, verbatim, in their order, with no parse filter.

    Fails if the draft could be a student rollout or a fixed draft, or if the attempts were one sampled
    rollout, a parsed subset (dropping "I give up."), deduplicated, shortened or reordered.
    """
    evidence = _three_of_each()
    long_attempt = _rollout("6", " " + "carry the one; " * 200)
    evidence.student_wrong["q"].append(long_attempt)
    evidence.student_wrong["q"].append(evidence.student_wrong["q"][0])  # a repeated wrong rollout is sent twice
    counts = _draws(_supervised("reflection"), evidence, "q", "source")
    assert set(counts) == set(evidence.teacher_correct["q"])
    for text in evidence.teacher_correct["q"]:
        assert 0.29 < counts[text] / 3000 < 0.38, counts
    (instance,) = _supervised("reflection").plan(evidence, 1, random.Random(0), {})
    assert instance.attempts == tuple(evidence.student_wrong["q"])
