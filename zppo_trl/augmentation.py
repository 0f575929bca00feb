"""Step 5 of Algorithm 1 as a seam: how the teacher's evidence on hard questions becomes extra groups.

An `Augmentation` plans instances on the pre-capped hard questions (identically on every rank,
from gathered evidence and the step's shared RNG) and builds, on each rank, the prompt block of
the instances dealt to it. The trainer samples one student group per built instance, scores it
like any group, and partitions it with the plain groups.

`CandidateReformulation` is ZPPO's: BCQ (one correct teacher answer and one wrong student
answer, anonymised and shuffled) and NCQ (the student's wrong answers as known-wrong), their
candidates compressed by the teacher before they enter the prompt. The paper's Hint and Prefix
controls (``alg:hint``, ``alg:prefix``) are `TeacherHint` and `ResponsePrefix`: one extra group per
hard question that has a graded-correct teacher rollout, built from one such rollout drawn
uniformly: an answer-free ``<hint>`` block before the closer, or the rollout's first
``floor(alpha * L)`` tokens as a response prefix the student continues (prefix tokens carry no loss).
"""

from __future__ import annotations

import logging
import math
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .prompts import bcq_block, hint_block, ncq_block
from .reformulate import KINDS, Reformulation, attach_compressions, plan_reformulations
from .rewards import extract_boxed, grade_batch

logger = logging.getLogger(__name__)

__all__ = [
    "AUGMENTATION_KINDS",
    "check_kinds",
    "make_augmentation",
    "Evidence",
    "Augmentation",
    "CandidateReformulation",
    "Guidance",
    "answer_free",
    "TeacherHint",
    "ResponsePrefix",
    "BuiltGroup",
    "BuiltGroups",
]

# Every kind of extra group or target, and the combinations a run may use: a subset of BCQ/NCQ (ZPPO
# and its ablations), or one of the paper's controls alone (each is its own row, never combined):
# Hint, Prefix, and the supervised Correction-SFT and Error-reflection-SFT (zppo_trl.supervised).
AUGMENTATION_KINDS = (*KINDS, "hint", "prefix", "correction", "reflection")
_ALONE = ("hint", "prefix", "correction", "reflection")


@dataclass(frozen=True)
class Evidence:
    """What step 4 gathered on the pre-capped hard questions, over every rank.

    Attributes:
        hard: the pre-capped keys, hardest first (`zppo_trl.reformulate.select_hard`).
        teacher_correct: key -> the teacher's graded-correct rollouts.
        student_wrong: key -> the student's wrong plain rollouts.
    """

    hard: Sequence[Hashable]
    teacher_correct: Mapping[Hashable, Sequence[str]]
    student_wrong: Mapping[Hashable, Sequence[str]]


class BuiltGroup(NamedTuple):
    """One group to sample: its kind and question key, the prompt block (None: the plain
    prompt) and the response prefix the student continues (token ids; None: no prefix).

    With ``target`` set it is instead one supervised instance (the SFT controls): the prompt is
    trained on that given response (cross-entropy on its tokens), nothing is sampled."""

    kind: str
    key: Hashable
    block: str | None = None
    response_prefix: tuple[int, ...] | None = None
    target: str | None = None


@dataclass
class BuiltGroups:
    """One rank's built instances: a :class:`BuiltGroup` per group to sample, the instances
    behind them (same order), and how many teacher calls of the build failed."""

    groups: list[BuiltGroup] = field(default_factory=list)
    instances: list[Any] = field(default_factory=list)
    failures: int = 0


def check_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
    """``kinds`` validated: a subset of ``("bcq", "ncq")``, or one of ``"hint"``, ``"prefix"``, ``"correction"``,
    ``"reflection"`` alone; no repeats."""
    kinds = tuple(kinds)
    unknown = [k for k in kinds if k not in AUGMENTATION_KINDS]
    if unknown or len(set(kinds)) != len(kinds):
        raise ValueError(f"reformulations must be distinct kinds from {list(AUGMENTATION_KINDS)}, got {list(kinds)}")
    alone = [k for k in kinds if k in _ALONE]
    if alone and len(kinds) > 1:
        raise ValueError(f"reformulations: {alone[0]!r} is a comparison row of its own (alg:{alone[0]}); use it alone, got {list(kinds)}")
    return kinds


def make_augmentation(
    kinds: Sequence[str], *, prefix_fraction: float = 0.4, tokenizer: Any = None, question_of: Any = None, teacher_chat: Any = None, grade: Any = None
) -> Augmentation | None:
    """The step-5 augmentation of a configuration's ``reformulations`` (None for none: GRPO†/GRPO).

    The supervised controls need the trainer's ``question_of(key)``, ``teacher_chat(key, text)``
    and ``grade(key, responses)`` (see :mod:`zppo_trl.supervised`); Prefix the student's tokenizer.
    """
    kinds = check_kinds(kinds)
    if not kinds:
        return None
    if kinds[0] in ("correction", "reflection"):
        from .supervised import CorrectionTargets, ReflectionTargets  # imports this module

        if None in (question_of, teacher_chat, grade):
            raise ValueError(f"the {kinds[0]} control needs question_of, teacher_chat and grade")
        cls = CorrectionTargets if kinds[0] == "correction" else ReflectionTargets
        return cls(question_of, teacher_chat, grade)
    if kinds == ("hint",):
        return TeacherHint()
    if kinds == ("prefix",):
        if tokenizer is None:
            raise ValueError("the Prefix control needs the student's tokenizer to cut the teacher's rollout into tokens")
        return ResponsePrefix(tokenizer, prefix_fraction)
    return CandidateReformulation(kinds)


class Augmentation(ABC):
    """One family of extra student groups built from the teacher's evidence (Algorithm 1, step 5).

    ``kinds`` names the group kinds it produces (they name its metrics and the groups' meta).
    """

    kinds: tuple[str, ...] = ()
    # whether step 2 samples G_T teacher rollouts per question for this augmentation's evidence
    needs_teacher_rollouts = True
    # whether its instances are supervised targets (BuiltGroup.target) rather than groups to sample
    supervised = False
    # metrics its build sets per rank that the trainer sums over ranks
    summed_metrics: tuple[str, ...] = ()

    @abstractmethod
    def plan(self, evidence: Evidence, limit: int, rng: random.Random, metrics: dict) -> list:
        """At most ``limit`` instances for the hard questions (the post-cap); the same on every rank."""

    @abstractmethod
    def build(self, instances: Sequence, teacher: Any, args: Any, metrics: dict) -> BuiltGroups:
        """This rank's instances made into groups; instances whose build failed are dropped."""

    def order(self, instances: Sequence) -> list:
        """The order instances are dealt round-robin over ranks in (default: as planned)."""
        return list(instances)

    def audit_counts(self, instances: Sequence, texts: Sequence[str], group_size: int) -> dict[str, float]:
        """Summable counts over this rank's sampled groups (``texts``: their rollouts, group-major),
        reduced over ranks by the trainer and turned into metrics by :meth:`audit_metrics`."""
        return {}

    def audit_metrics(self, totals: Mapping[str, float]) -> dict[str, float]:
        """Metrics from the summed :meth:`audit_counts`."""
        return {}


class CandidateReformulation(Augmentation):
    """ZPPO's BCQ and NCQ prompts (`fig:prompt-bcq`, `fig:prompt-ncq`), candidates compressed first."""

    def __init__(self, kinds: Sequence[str] = KINDS):
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown reformulation kind(s) {sorted(unknown)}; expected a subset of {KINDS}")
        self.kinds = tuple(kind for kind in KINDS if kind in kinds)

    def plan(self, evidence: Evidence, limit: int, rng: random.Random, metrics: dict) -> list[Reformulation]:
        parsed = {key for key in evidence.hard if any(extract_boxed(t) is not None for t in evidence.student_wrong.get(key, ()))}
        metrics["hard"] = len(evidence.hard)
        metrics["hard_bcq_possible"] = sum(1 for key in parsed if evidence.teacher_correct.get(key))
        metrics["hard_ncq_only"] = len(parsed) - metrics["hard_bcq_possible"]
        planned = plan_reformulations(evidence.hard, evidence.teacher_correct, evidence.student_wrong, limit, self.kinds, rng=rng)
        questions = len({inst.key for inst in planned})
        metrics["teacher_success_rate"] = sum(inst.kind == "bcq" for inst in planned) / questions if questions else 0.0
        return planned

    def order(self, instances: Sequence[Reformulation]) -> list[Reformulation]:
        # BCQ first then NCQ, so that round-robin dealing gives every rank a mix of both kinds.
        return sorted(instances, key=lambda inst: inst.kind != "bcq")

    def build(self, instances: Sequence[Reformulation], teacher: Any, args: Any, metrics: dict) -> BuiltGroups:
        """Compress this rank's candidates (one teacher batch) and render each kept instance's block.

        BCQ needs both candidates compressed; NCQ keeps the ones that compressed
        (`zppo_trl.reformulate.attach_compressions`). With ``compress_candidates`` off (not the
        paper's setting) the raw rollouts are the candidates and the teacher is not called.
        """
        if not instances:
            return BuiltGroups()
        t0 = time.perf_counter()
        sources = [text for inst in instances for text in inst.candidates]
        if args.compress_candidates:
            future = teacher.compress_async(
                sources,
                max_tokens=args.compression_max_tokens,
                temperature=args.teacher_temperature,
                top_p=args.teacher_top_p,
                extra_body=args.compression_extra_body,
            )
            compressed = teacher_results(future, [None] * len(sources))
        else:
            compressed = list(sources)
        metrics["time/compression_s"] = time.perf_counter() - t0
        kept, failed = attach_compressions(instances, compressed)
        built = BuiltGroups(failures=failed)
        for inst, texts in kept:
            block = bcq_block(texts) if inst.kind == "bcq" else ncq_block(inst.wrong_answers, texts)
            built.groups.append(BuiltGroup(inst.kind, inst.key, block))
            built.instances.append(inst)
        return built

    def audit_counts(self, instances: Sequence[Reformulation], texts: Sequence[str], group_size: int) -> dict[str, float]:
        """Which candidate's answer each BCQ rollout gave (teacher's, student's, neither), and how
        many NCQ rollouts repeat a listed wrong answer."""
        counts = dict.fromkeys(("bcq_teacher", "bcq_student", "bcq_neither", "ncq_repeats", "ncq_rollouts"), 0.0)
        for g, inst in enumerate(instances):
            group = texts[g * group_size : (g + 1) * group_size]
            answers = inst.candidate_answers()
            if inst.kind == "bcq":
                teacher = grade_batch(group, [answers[inst.teacher_position]] * len(group))
                student = grade_batch(group, [answers[1 - inst.teacher_position]] * len(group))
                for t, s in zip(teacher, student):
                    counts["bcq_teacher" if t else "bcq_student" if s else "bcq_neither"] += 1
            else:
                repeats = [False] * len(group)
                for wrong in inst.wrong_answers:
                    repeats = [a or b for a, b in zip(repeats, grade_batch(group, [wrong] * len(group)))]
                counts["ncq_repeats"] += sum(repeats)
                counts["ncq_rollouts"] += len(group)
        return counts

    def audit_metrics(self, totals: Mapping[str, float]) -> dict[str, float]:
        bcq = sum(totals.get(f"bcq_{name}", 0.0) for name in ("teacher", "student", "neither"))
        out = {f"bcq_match_{name}": totals.get(f"bcq_{name}", 0.0) / bcq if bcq else 0.0 for name in ("teacher", "student", "neither")}
        rollouts = totals.get("ncq_rollouts", 0.0)
        out["ncq_repeat_rate"] = totals.get("ncq_repeats", 0.0) / rollouts if rollouts else 0.0
        return out


def answer_free(hint: str) -> bool:
    """Whether a hint keeps ``fig:prompt-hint``'s one checkable rule: no ``\\boxed{}`` expression."""
    return "\\boxed" not in hint


@dataclass(frozen=True)
class Guidance:
    """One planned Hint or Prefix instance: a hard question and the graded-correct teacher
    rollout (drawn uniformly among its correct ones) that guides its extra group."""

    kind: str
    key: Hashable
    teacher_response: str


class _TeacherGuidance(Augmentation):
    """Planning shared by the Hint and Prefix controls (the "shared augmentation-branch convention").

    Walks the pre-capped hard questions, hardest first, and plans one instance for each that has
    at least one graded-correct teacher rollout (``N_x > 0``), one such rollout drawn uniformly;
    at most ``limit`` instances. A question without one contributes no group.
    """

    kind = ""

    def plan(self, evidence: Evidence, limit: int, rng: random.Random, metrics: dict) -> list[Guidance]:
        metrics["hard"] = len(evidence.hard)
        solved = [key for key in evidence.hard if evidence.teacher_correct.get(key)]
        metrics[f"hard_{self.kind}_possible"] = len(solved)
        return [Guidance(self.kind, key, rng.choice(list(evidence.teacher_correct[key]))) for key in solved[:limit]]


class TeacherHint(_TeacherGuidance):
    """The Hint control (``alg:hint``, ``fig:prompt-hint``): the teacher reads one graded-correct
    rollout of its own and writes a hint; the student samples a group on the question with a
    ``<hint>`` block before the closer (training only; evaluation never shows one).

    The template forbids revealing the answer and any ``\boxed{}``; a hint that still contains a
    ``\boxed{`` is discarded (counted in ``hint_rejected``), so no hint in a prompt carries a boxed
    answer. The request reuses the compression call's cap and sampling settings
    (``compression_max_tokens``, ``compression_extra_body``): both are short rewrites of one teacher
    rollout, and the paper gives the hint no cap of its own.
    """

    kind = "hint"
    kinds = ("hint",)
    summed_metrics = ("hint_rejected",)

    def build(self, instances: Sequence[Guidance], teacher: Any, args: Any, metrics: dict) -> BuiltGroups:
        if not instances:
            return BuiltGroups()
        t0 = time.perf_counter()
        future = teacher.hint_async(
            [inst.teacher_response for inst in instances],
            max_tokens=args.compression_max_tokens,
            temperature=args.teacher_temperature,
            top_p=args.teacher_top_p,
            extra_body=args.compression_extra_body,
        )
        hints = teacher_results(future, [None] * len(instances))
        metrics["time/compression_s"] = time.perf_counter() - t0
        built = BuiltGroups()
        rejected = 0
        for inst, hint in zip(instances, hints):
            if hint is None:
                built.failures += 1
            elif not answer_free(hint):
                rejected += 1
            else:
                built.groups.append(BuiltGroup(self.kind, inst.key, hint_block(hint)))
                built.instances.append(inst)
        metrics["hint_rejected"] = rejected
        return built


class ResponsePrefix(_TeacherGuidance):
    """The Prefix control (``alg:prefix``, alpha = 0.4): the first ``floor(alpha * L)`` tokens of one
    graded-correct teacher rollout open the student's response; the student continues it.

    ``L`` counts the rollout's tokens under the student's tokenizer (the paper's teacher and
    student share a tokenizer family). The prompt is unchanged. The trainer conditions the group's
    rollouts on the prefix (it ends the generation prompt), so no prefix token is sampled by the
    student or enters the loss, and grades ``prefix || continuation``; prefix and continuation share
    ``max_completion_length``. A prefix that would leave no room to continue is dropped.
    """

    kind = "prefix"
    kinds = ("prefix",)
    summed_metrics = ("prefix_unusable",)

    def __init__(self, tokenizer: Any, fraction: float = 0.4):
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"prefix_fraction (alpha) must be in (0, 1), got {fraction}")
        self.tokenizer = tokenizer
        self.fraction = fraction

    def prefix_ids(self, response: str) -> tuple[int, ...]:
        """The first ``floor(alpha * L)`` token ids of ``response`` (no special tokens added)."""
        ids = self.tokenizer(response, add_special_tokens=False)["input_ids"]
        return tuple(ids[: math.floor(self.fraction * len(ids) + 1e-9)])

    def build(self, instances: Sequence[Guidance], teacher: Any, args: Any, metrics: dict) -> BuiltGroups:
        built = BuiltGroups()
        too_long = 0
        for inst in instances:
            prefix = self.prefix_ids(inst.teacher_response)
            if not prefix or len(prefix) >= args.max_completion_length:
                too_long += 1
                continue
            built.groups.append(BuiltGroup(self.kind, inst.key, None, prefix))
            built.instances.append(inst)
        metrics["prefix_unusable"] = too_long
        return built


def teacher_results(future: Any, fallback: list) -> list:
    """A teacher batch's results; on an unexpected error ``fallback`` (logged), never a crash."""
    try:
        return future.result()
    except Exception as err:  # noqa: BLE001 - an outage must degrade the step, not stop training
        logger.warning("teacher request failed (%s); continuing without it", err)
        return fallback
