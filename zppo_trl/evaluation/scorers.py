"""The deterministic half of the harness's scoring paths, and the settings' aggregation rules.

Source of truth: the paper's benchmark appendix and its "Prompt and judge templates" paragraph.
Every setting has one scoring path (`TaskSpec.scoring`):

* ``exact+judge``: **Exact** is the project's boxed grader (`zppo_trl.rewards.grade`: mathruler
  on the last ``\\boxed{}`` span, then the degree/percent retry) against the gold string
  (`exact_gold`: a multiple-choice gold becomes its option letter, `TaskSpec.gold_form`).
* ``rule+judge``: **Rule** is the benchmark's own matching rule (`TaskSpec.rule`: MathVista,
  MVBench, Video-MME, Video-MMMU), each re-implemented in its benchmark module from its upstream
  evaluator, cited where it is defined.
* ``det``: **Det.** is deterministic scoring only (`TaskSpec.det`): ANLS for InfographicVQA,
  OCRBench v2's official per-task metrics for OCR-EN / OCR-ZH.
* ``benchjudge``: no deterministic step (the benchmark's own judge prompt, `zppo_trl.evaluation.judges`).

What the deterministic step sees. The paper: "The shared judge scores free-form answers when the
boxed span does not parse, or when it parses and does not match", and "If a \\boxed{} span
parses but does not match, the judge receives the extracted snippet. If no strict span parses,
it reads the full response." So Rule (like Exact) is applied to the last boxed span, and a
response without a span scores 0 deterministically and goes to the judge whole. The paper is
silent on Det. without a span; we score it 0 as well (the closer demands a box, and the
containment metrics of OCRBench v2 would otherwise reward long reasoning that merely mentions
the answer).

Upstream quirks are kept where they decide a verdict (they are the benchmark's rule); each one is
commented in its benchmark module. Scores are fractions in [0, 1]; `aggregate` returns a fraction too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from . import aggregation
from .metrics import choice_gold, extract_boxed, gold_field, grade, require
from .spec import PRESENTED_OPTIONS, ItemRecord, ItemVerdict, TaskSpec
from .tasks import SUITE

__all__ = [
    "PRESENTED_OPTIONS",
    "ItemRecord",
    "ItemVerdict",
    "aggregate",
    "exact_gold",
    "rule_gold",
    "score_deterministic",
]


def _spec(spec: TaskSpec | str) -> TaskSpec:
    return SUITE[spec] if isinstance(spec, str) else spec


def exact_gold(spec: TaskSpec, row: Mapping[str, Any]) -> str:
    """The gold string Exact compares the boxed answer with.

    Multiple-choice rows (options non-empty) normalise to the option letter: an index maps to
    its letter, a letter (``"b"``, ``"(B)"``, ``"B."``) to its upper case, and for GPQA-D the
    correct text to its position in `PRESENTED_OPTIONS` (required there: the prompt shuffles).
    Other rows keep the gold verbatim (stripped). A benchmark whose gold needs more sets
    `TaskSpec.exact_gold` (BabyVision's two answer columns, MathVision's free-form rows).
    ValueError names the field on a malformed row.
    """
    if spec.exact_gold is not None:
        return spec.exact_gold(spec, row)
    return choice_gold(spec, row, gold_field(spec, row))


def rule_gold(spec: TaskSpec, row: Mapping[str, Any]) -> str:
    """The gold a Rule setting reports: `TaskSpec.rule_gold`, else the row's ``answer``."""
    if spec.rule_gold is not None:
        return spec.rule_gold(spec, row)
    return str(require(spec, row, "answer"))


def score_deterministic(
    spec: TaskSpec | str,
    response: str | None,
    row: Mapping[str, Any],
    *,
    grader: Callable[[str, str], bool] = grade,
) -> ItemVerdict:
    """Score one response on its setting's deterministic path (Exact, Rule or Det.).

    Args:
        spec: the setting (a `TaskSpec` or its name in `SUITE`).
        response: the student's full response; None or any string (never raises on it).
        row: the dataset row (its upstream columns; plus `PRESENTED_OPTIONS` for GPQA-D).
        grader: the Exact grader, ``(response, gold) -> bool`` (default `zppo_trl.rewards.grade`).

    Returns the `ItemVerdict`. ValueError on a malformed row (naming the missing field) and on
    ``benchjudge`` settings, which have no deterministic step; NotImplementedError on OCRBench v2
    task types that are not implemented.
    """
    spec = _spec(spec)
    if spec.scoring == "benchjudge":
        raise ValueError(f"{spec.name} is scored by its benchmark judge alone; it has no deterministic step")
    text = response if isinstance(response, str) else ""
    group = None
    if spec.group_field is not None:
        group = str(require(spec, row, spec.group_field))
    extracted = extract_boxed(text)

    if spec.scoring == "exact+judge":
        gold = exact_gold(spec, row)
        score, rule = (1.0 if grader(text, gold) else 0.0), "exact"
    elif spec.scoring == "rule+judge":
        gold = rule_gold(spec, row)
        if extracted is None:
            spec.rule("", row, spec)  # still validates the row
            score, rule = 0.0, "rule:no-span"
        else:
            ok, rule = spec.rule(extracted, row, spec)
            score = 1.0 if ok else 0.0
    else:  # det
        gold, score, rule = spec.det(spec, extracted, row)
        return ItemVerdict(extracted, float(score), False, None, gold, group, rule)

    consult = score == 0.0
    judge_input = extracted if extracted is not None else text
    return ItemVerdict(extracted, score, consult, judge_input, gold, group, rule)


def aggregate(spec: TaskSpec | str, items: Iterable[ItemRecord | ItemVerdict | Mapping[str, Any]]) -> float:
    """A setting's score in [0, 1] from its items' final scores (judge verdicts included).

    ``mean``: item accuracy. ``graded``: the mean of MM-Vet's [0, 1] grades. ``worst_case_variants``
    (DynaMath): a group (seed) counts 1 only when every one of its items (variants) scores 1; the
    mean over groups. Run it per evaluation pass. ``mean_of_tasks`` (VBlind): the mean over groups
    (the 7 BlindTest tasks) of each group's accuracy. Items are `ItemRecord`, `ItemVerdict` or
    mappings with ``score`` and ``group``. ValueError on no items, a score outside [0, 1], or a
    missing group key where the rule needs one.
    """
    return aggregation.aggregate(_spec(spec), items)
