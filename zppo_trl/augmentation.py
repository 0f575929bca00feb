"""Step 5 of Algorithm 1 as a seam: how the teacher's evidence on hard questions becomes extra groups.

An `Augmentation` plans instances on the pre-capped hard questions (identically on every rank,
from gathered evidence and the step's shared RNG) and builds, on each rank, the prompt block of
the instances dealt to it. The trainer samples one student group per built instance, scores it
like any group, and partitions it with the plain groups.

`CandidateReformulation` is ZPPO's: BCQ (one correct teacher answer and one wrong student
answer, anonymised and shuffled) and NCQ (the student's wrong answers as known-wrong), their
candidates compressed by the teacher before they enter the prompt. The paper's comparison rows
(Hint, Prefix) are further implementations of the same two methods.
"""

from __future__ import annotations

import logging
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .prompts import bcq_block, ncq_block
from .reformulate import KINDS, Reformulation, attach_compressions, plan_reformulations
from .rewards import extract_boxed

logger = logging.getLogger(__name__)

__all__ = ["Evidence", "Augmentation", "CandidateReformulation", "BuiltGroups"]


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


@dataclass
class BuiltGroups:
    """One rank's built instances: ``(kind, key, block)`` per group to sample, the instances
    behind them (same order), and how many teacher calls of the build failed."""

    groups: list[tuple[str, Hashable, str | None]] = field(default_factory=list)
    instances: list[Any] = field(default_factory=list)
    failures: int = 0


class Augmentation(ABC):
    """One family of extra student groups built from the teacher's evidence (Algorithm 1, step 5).

    ``kinds`` names the group kinds it produces (they name its metrics and the groups' meta).
    """

    kinds: tuple[str, ...] = ()

    @abstractmethod
    def plan(self, evidence: Evidence, limit: int, rng: random.Random, metrics: dict) -> list:
        """At most ``limit`` instances for the hard questions (the post-cap); the same on every rank."""

    @abstractmethod
    def build(self, instances: Sequence, teacher: Any, args: Any, metrics: dict) -> BuiltGroups:
        """This rank's instances made into groups; instances whose build failed are dropped."""

    def order(self, instances: Sequence) -> list:
        """The order instances are dealt round-robin over ranks in (default: as planned)."""
        return list(instances)


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
        return plan_reformulations(evidence.hard, evidence.teacher_correct, evidence.student_wrong, limit, self.kinds, rng=rng)

    def order(self, instances: Sequence[Reformulation]) -> list[Reformulation]:
        # BCQ first then NCQ, so that round-robin dealing gives every rank a mix of both kinds.
        return sorted(instances, key=lambda inst: inst.kind != "bcq")

    def build(self, instances: Sequence[Reformulation], teacher: Any, args: Any, metrics: dict) -> BuiltGroups:
        """Compress this rank's candidates (one teacher batch) and render each kept instance's block.

        BCQ needs both candidates compressed; NCQ keeps the ones that compressed
        (`zppo_trl.reformulate.attach_compressions`).
        """
        if not instances:
            return BuiltGroups()
        t0 = time.perf_counter()
        sources = [text for inst in instances for text in inst.candidates]
        future = teacher.compress_async(
            sources,
            max_tokens=args.compression_max_tokens,
            temperature=args.teacher_temperature,
            top_p=args.teacher_top_p,
            extra_body=args.compression_extra_body,
        )
        compressed = _result_or_none(future, len(sources))
        metrics["time/compression_s"] = time.perf_counter() - t0
        kept, failed = attach_compressions(instances, compressed)
        built = BuiltGroups(failures=failed)
        for inst, texts in kept:
            block = bcq_block(texts) if inst.kind == "bcq" else ncq_block(inst.wrong_answers, texts)
            built.groups.append((inst.kind, inst.key, block))
            built.instances.append(inst)
        return built


def _result_or_none(future: Any, count: int) -> list:
    """A compression batch's results; on an unexpected error all None (logged), never a crash."""
    try:
        return future.result()
    except Exception as err:  # noqa: BLE001 - an outage must degrade the step, not stop training
        logger.warning("teacher request failed (%s); continuing without it", err)
        return [None] * count
