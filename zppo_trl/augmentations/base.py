"""The step-5 seam (Algorithm 1, step 5): how the teacher's evidence on hard questions becomes extra groups.

An `Augmentation` plans instances on the pre-capped hard questions (identically on every rank,
from gathered evidence and the step's shared RNG) and builds, on each rank, the prompt block of
the instances dealt to it. The trainer samples one student group per built instance, scores it
like any group, and partitions it with the plain groups. An augmentation whose instances are
supervised targets (the SFT controls) builds responses to fit instead of groups to sample.

This module is the seam alone: what every augmentation receives (`Evidence`, `AugmentationInputs`)
and returns (`BuiltGroup`, `BuiltGroups`), the `Augmentation` base class, and `teacher_results`,
the shared guard around a teacher batch. The families live next to it (`candidates`, `guidance`,
`targets`) and the package's ``__init__`` registers them by kind name.
"""

from __future__ import annotations

import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..needs import Needs
from ..prompt_sizes import PromptSizes

logger = logging.getLogger(__name__)

__all__ = ["Augmentation", "AugmentationInputs", "BuiltGroup", "BuiltGroups", "Evidence", "teacher_results"]


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


@dataclass(frozen=True)
class AugmentationInputs:
    """What the trainer offers an augmentation when it is made (each family takes what it needs).

    Attributes:
        prefix_fraction: alpha of the Prefix control (the configuration's ``prefix_fraction``).
        tokenizer: the student's tokenizer (Prefix cuts the teacher's rollout into its tokens).
        question_of: key -> the question text, without the closer (the supervised controls).
        teacher_chat: key, text -> the teacher chat: the question's images (if any), then the text.
        grade: keys, responses per key -> one verdict per response, by the trainer's reward functions.
        answer_of: key -> the question's gold answer (the Hint control's leak count).
        bcq_candidate_content: what a BCQ candidate block shows (`zppo_trl.augmentations.candidate_content`).
    """

    prefix_fraction: float = 0.4
    tokenizer: Any = None
    question_of: Any = None
    teacher_chat: Any = None
    grade: Any = None
    answer_of: Any = None
    bcq_candidate_content: str = "full"


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
    behind them (same order), and how many teacher calls of the build failed. ``shown``, where the
    family fills it (BCQ/NCQ), holds each instance's candidate texts as its prompt shows them (same
    order; the trace-overlap audit's teacher reference is a BCQ instance's ``teacher_position``)."""

    groups: list[BuiltGroup] = field(default_factory=list)
    instances: list[Any] = field(default_factory=list)
    failures: int = 0
    shown: list[tuple[str, ...]] = field(default_factory=list)


class Augmentation(ABC):
    """One family of extra student groups built from the teacher's evidence (Algorithm 1, step 5).

    ``kinds`` names the group kinds it produces (they name its metrics and the groups' kind).
    """

    kinds: tuple[str, ...] = ()
    # what it asks of the run: by default step 2's G_T teacher rollouts per question (its evidence) and teacher
    # requests of its own while building (compression, hints)
    needs: Needs = Needs(teacher_samples=True, teacher_requests=True)
    # whether its instances are supervised targets (BuiltGroup.target) rather than groups to sample
    supervised = False
    # metrics its build sets per rank that the trainer sums over ranks
    summed_metrics: tuple[str, ...] = ()
    # text before the closer of every evaluation question for a checkpoint trained with it (None: the
    # paper's shared prompt); the trainer records it in the saved config for `zppo-eval run` to apply
    evaluation_condition: str | None = None
    # the settings it reads besides its kinds, each with the kinds that read it (the configuration warns about a
    # setting no part of the row reads)
    reads: Mapping[str, tuple[str, ...]] = {}
    # the model card's words: where the teacher's text goes (an augmentation the student samples on), or what the
    # cross-entropy fits (a supervised control); and the name of a row the family is on its own (the supervised
    # controls: "Correction-SFT"; None: the row is GRPO plus its kinds)
    enters: str = "enter the *prompt*"
    fits: str | None = None
    printed: str | None = None

    @classmethod
    def teacher_role(cls, args: Any) -> str:
        """The model card's words for what the teacher does with its answers (``args``: the configuration)."""
        return ""

    @classmethod
    def qualifiers(cls, args: Any) -> list[str]:
        """What the row's name adds for its settings where they are not the paper's (``"ZPPO (boxed masked)"``)."""
        return []

    @classmethod
    def teacher_use(cls, args: Any) -> str:
        """The dry run's words for what the teacher does for it."""
        return ""

    @classmethod
    def prompt_blocks(cls, kinds: tuple[str, ...], sizes: PromptSizes) -> list[int]:
        """A bound on the tokens of each block its ``kinds`` add to a student prompt (:mod:`zppo_trl.context`)."""
        return []

    @classmethod
    def teacher_request(cls, sizes: PromptSizes) -> int:
        """A bound on the tokens of the request its build sends the teacher with the reply (0: only the compressions
        every augmentation's bound covers)."""
        return 0

    @classmethod
    def create(cls, kinds: tuple[str, ...], inputs: AugmentationInputs) -> Augmentation:
        """The augmentation for the configuration's validated ``kinds`` (all of this family), made from
        what the trainer offers; a family that needs an input it was not given raises ValueError.
        By default the family takes nothing."""
        return cls()

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


def teacher_results(future: Any, fallback: list) -> list:
    """A teacher batch's results; on an unexpected error ``fallback`` (logged), never a crash."""
    try:
        return future.result()
    except Exception as err:  # noqa: BLE001 - an outage must degrade the step, not stop training
        logger.warning("teacher request failed (%s); continuing without it", err)
        return fallback
