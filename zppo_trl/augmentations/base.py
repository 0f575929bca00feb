"""The step-5 seam (Algorithm 1, steps 4-5): what a row makes of the scored plain round.

Every row has one step-5 part, a :class:`Source`, and the trainer runs the same stages for every row:

- step 4, :meth:`Source.evidence_keys`: the questions it takes evidence on (ZPPO: the pre-capped hard ones), for
  which the trainer gathers the teacher's graded replies and the wrong plain rollouts (`Evidence`);
- step 5, :meth:`Source.plan` (identically on every rank, from gathered evidence and the step's shared RNG) and
  :meth:`Source.build` (the instances dealt to this rank), then :meth:`Source.second_round`;
- step 6 reads :attr:`Source.supervised`: groups the student sampled are partitioned with the plain ones under the
  two-step advantages, targets it fits go to their questions' partitions.

Two families implement it. An `Augmentation` builds prompt blocks the student samples a second round on (ZPPO's
BCQ/NCQ, the Hint and Prefix controls; `NoAugmentation` is GRPO\u2020's, which builds nothing). A `TargetSource`
builds responses the student fits, teacher-forced (the SFT controls here, Off-/On-Distill in
:mod:`zppo_trl.distill`).

This module is the seam alone: what every source receives (`Evidence`, `AugmentationInputs`) and returns
(`BuiltGroup`, `BuiltGroups`), the base classes, and `teacher_results`, the shared guard around a teacher batch.
The augmentations live next to it (`candidates`, `guidance`, `targets`) and the package's ``__init__`` registers
them by kind name.
"""

from __future__ import annotations

import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..description import Description, served_teacher
from ..losses import SFT_LOSS
from ..needs import Needs
from ..prompt_sizes import PromptSizes
from ..reformulate import select_hard

logger = logging.getLogger(__name__)

__all__ = [
    "Augmentation",
    "AugmentationInputs",
    "BuiltGroup",
    "BuiltGroups",
    "Evidence",
    "NoAugmentation",
    "Source",
    "TargetSource",
    "teacher_results",
]


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
    # the zppo_trl.early_rollouts.EarlyBatch its groups were sent through as they were built (None: with the round)
    early: Any = None


class Source(ABC):
    """A row's step-5 part (Algorithm 1, steps 4-5), of either family (see the module's docstring).

    ``kinds`` names the group kinds it produces (they name its metrics and the groups' kind).
    """

    family = ""
    kinds: tuple[str, ...] = ()
    # what it asks of the run: by default step 2's G_T teacher rollouts per question (its evidence) and teacher
    # requests of its own while building (compression, hints)
    needs: Needs = Needs(teacher_samples=True, teacher_requests=True)
    # whether its instances are targets the student fits (BuiltGroup.target) rather than groups to sample
    supervised = False
    # the registered loss (zppo_trl.losses) step 6 trains on its targets; None: the row's policy objective
    loss: str | None = None
    # metrics its build sets per rank that the trainer sums over ranks
    summed_metrics: tuple[str, ...] = ()
    # text before the closer of every evaluation question for a checkpoint trained with it (None: the
    # paper's shared prompt); the trainer records it in the saved config for `zppo-eval run` to apply
    evaluation_condition: str | None = None
    # the settings it reads besides its kinds, each with the kinds that read it (the configuration warns about a
    # setting no part of the row reads; zppo_trl.parts)
    reads: Mapping[str, tuple[str, ...]] = {}
    # the name of a row the family is on its own (the supervised controls: "Correction-SFT"; None: the row is GRPO
    # plus its kinds)
    printed: str | None = None

    @classmethod
    def describe(cls, args: Any) -> Description:
        """What it says in the dry run and the model card for the configuration ``args``
        (:class:`zppo_trl.description.Description`); each family says it in its own words."""
        return Description()

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
    def check_settings(cls, args: Any) -> None:
        """Its own settings' values (``args``: the configuration), whatever the row; raises ValueError naming the
        field. By default it has none to check."""
        return None

    @classmethod
    def validate(cls, args: Any) -> None:
        """Refuse a configuration that selects it but that it cannot train (by default: one without a teacher server,
        which its evidence and requests come from)."""
        if cls.needs.teacher_samples or cls.needs.teacher_requests:
            if not (args.teacher_base_url and args.teacher_model):
                raise ValueError(
                    f"augmentations {args.augmentations} need a teacher: set teacher_base_url and teacher_model "
                    "(or augmentations: [] for GRPO\u2020)"
                )

    @classmethod
    def create(cls, kinds: tuple[str, ...], inputs: AugmentationInputs) -> Source:
        """The part for the configuration's validated ``kinds`` (all of this family), made from
        what the trainer offers; a family that needs an input it was not given raises ValueError.
        By default the family takes nothing."""
        return cls()

    @property
    def second_round_sampled(self) -> bool:
        """Whether step 5 has the student sample a second round (an augmentation with kinds)."""
        return not self.supervised and bool(self.kinds)

    # ------------------------------------------------------------------ the stages, in the order the trainer calls

    def evidence_keys(
        self, accuracy: Mapping[Hashable, float], draw: Any, limit: int, threshold: float, rng: random.Random
    ) -> list | None:
        """Step 4: the questions it takes evidence on, or None for no step 4. By default the pre-cap: the
        questions below ``threshold``, hardest first, at most ``limit`` (:func:`zppo_trl.reformulate.select_hard`)."""
        return select_hard(accuracy, limit, threshold, rng=rng)

    @abstractmethod
    def plan(self, evidence: Evidence, limit: int, rng: random.Random, metrics: dict) -> list:
        """At most ``limit`` instances for the hard questions (the post-cap); the same on every rank."""

    @abstractmethod
    def build(self, instances: Sequence, teacher: Any, args: Any, metrics: dict, ready: Any = None) -> BuiltGroups:
        """This rank's instances made into groups; instances whose build failed are dropped.

        ``ready``, where given, is called with each :class:`BuiltGroup` the moment it is built, from whatever thread
        built it (a pipelined second round sends its prompt then, :mod:`zppo_trl.early_rollouts`). A part that builds
        all its groups at once may ignore it: they are then sent with the round."""

    def order(self, instances: Sequence) -> list:
        """The order instances are dealt round-robin over ranks in (default: as planned)."""
        return list(instances)

    def build_metrics(self, plan: Sequence, built: BuiltGroups, ranks: Any, metrics: Mapping) -> dict[str, float]:
        """What the build reports over all ``ranks`` (:class:`zppo_trl.ranks.Ranks`): the teacher calls that failed,
        the planned instances no rank built, and its own per-rank counts in ``metrics``, summed."""
        out = {
            "compression_failures": ranks.total(built.failures),
            "dropped": len(plan) - ranks.total(len(built.instances)),
        }
        for name in self.summed_metrics:
            out[name] = ranks.total(metrics.get(name, 0))
        return out

    @abstractmethod
    def second_round(self, rounds: Any, built: BuiltGroups, most_built: int, filler_row: Mapping, plain: Any) -> Any:
        """Step 5's second round (a :class:`zppo_trl.rollout.Round`), played by ``rounds``
        (:class:`zppo_trl.rounds.Rounds`): the student's groups on what was built (``most_built``: the most groups any
        rank built), or the targets teacher-forced; ``filler_row`` pads a rank, ``plain`` is the scored plain round."""

    @abstractmethod
    def record(self, recorder: Any, plan: Sequence, built: BuiltGroups, plain: Any, second: Any) -> None:
        """The step's numbers on it, into ``recorder`` (:class:`zppo_trl.step_records.StepRecorder`)."""

    def audit_counts(self, instances: Sequence, texts: Sequence[str], group_size: int) -> dict[str, float]:
        """Summable counts over this rank's sampled groups (``texts``: their rollouts, group-major),
        reduced over ranks by the trainer and turned into metrics by :meth:`audit_metrics`."""
        return {}

    def audit_metrics(self, totals: Mapping[str, float]) -> dict[str, float]:
        """Metrics from the summed :meth:`audit_counts`."""
        return {}


class Augmentation(Source):
    """One family of extra student groups built from the teacher's evidence (Algorithm 1, step 5): the student
    samples a group on every built instance, scored and partitioned like a plain group."""

    family = "augmentation"
    # the model card's words for where the teacher's text goes
    enters = "enter the *prompt*"

    @classmethod
    def describe(cls, args: Any) -> Description:
        """The card's opening (where the teacher's answers go, for its kinds) and Teacher line; the dry run's teacher
        words (:meth:`Source.teacher_use`)."""
        kinds = " and ".join(kind.upper() if len(kind) == 3 else kind.capitalize() for kind in args.augmentations)
        return Description(
            card=f"On questions the student mostly fails, the teacher's answers {cls.enters} ({kinds}), never the "
            "gradient.",
            teacher_use=(cls.teacher_use(args),),
            teacher=f"{served_teacher(args)}: {_samples(cls, args)}{cls.teacher_role(args)}; its text is only ever "
            "context (prompt or response prefix), never a loss token.",
        )

    def second_round(self, rounds: Any, built: BuiltGroups, most_built: int, filler_row: Mapping, plain: Any) -> Any:
        """The student's group on each built instance, ranks padded with fillers to ``most_built``."""
        return rounds.augmented(built, most_built, filler_row)

    def record(self, recorder: Any, plan: Sequence, built: BuiltGroups, plain: Any, second: Any) -> None:
        """Both rounds' groups (their logs), and per kind the instances planned and trained, the in-prompt accuracy
        and its own audit."""
        recorder.groups((plain, second))
        recorder.augmentation(self, plan, built, second)


class NoAugmentation(Augmentation):
    """GRPO\u2020's step 5 (and GRPO's): no augmentation. No step 4, nothing planned or built; the second round is
    empty, and the step trains its plain groups alone."""

    needs = Needs()

    @classmethod
    def describe(cls, args: Any) -> Description:
        """The card's opening says whether a teacher takes part at all (a term's or the objective's); its Teacher
        line is composed from the row's needs."""
        if args.row.uses_teacher:
            return Description(card="The teacher never enters the student's prompt; what it does is on the Teacher "
                               "line below.")  # fmt: skip
        return Description(card="No teacher takes part.")

    def evidence_keys(
        self, accuracy: Mapping[Hashable, float], draw: Any, limit: int, threshold: float, rng: random.Random
    ) -> list | None:
        return None  # no evidence: no pre-cap drawn from the step's RNG either

    def plan(self, evidence: Evidence | None, limit: int, rng: random.Random, metrics: dict) -> list:
        return []

    def build(self, instances: Sequence, teacher: Any, args: Any, metrics: dict, ready: Any = None) -> BuiltGroups:
        return BuiltGroups()

    def record(self, recorder: Any, plan: Sequence, built: BuiltGroups, plain: Any, second: Any) -> None:
        recorder.groups((plain, second))


class TargetSource(Source):
    """A row that fits targets instead of sampling a second round (the SFT controls, Off-/On-Distill): step 5's
    targets are teacher-forced through the student's scoring, and step 6 trains :attr:`Source.loss` on them, each in
    its question's partition."""

    family = "targets"
    supervised = True
    loss = SFT_LOSS
    # the model card's words for what the cross-entropy fits
    fits: str = ""

    @classmethod
    def describe(cls, args: Any) -> Description:
        """The card's opening (what the cross-entropy fits) and Teacher line; the dry run's teacher words."""
        return Description(
            card=f"The student is fine-tuned with cross-entropy on {cls.fits}, each graded correct before use.",
            teacher_use=(cls.teacher_use(args),),
            teacher=f"{served_teacher(args)}: {_samples(cls, args)}{cls.teacher_role(args)}.",
        )

    def second_round(self, rounds: Any, built: BuiltGroups, most_built: int, filler_row: Mapping, plain: Any) -> Any:
        """Every rank's targets teacher-forced (nothing is sampled)."""
        return rounds.targets(built, filler_row)

    def record(self, recorder: Any, plan: Sequence, built: BuiltGroups, plain: Any, second: Any) -> None:
        """Instances planned, instances with a verified target, and targets (all ranks)."""
        recorder.targets(self.kinds[0], plan, built)


def _samples(cls: type[Source], args: Any) -> str:
    """The card's words for step 2's teacher rollouts, where the source's evidence needs them."""
    if not cls.needs.teacher_samples:
        return ""
    return f"it samples G_T = {args.teacher_num_generations} answers per question and "


def teacher_results(future: Any, fallback: list) -> list:
    """A teacher batch's results; on an unexpected error ``fallback`` (logged), never a crash."""
    try:
        return future.result()
    except Exception as err:  # noqa: BLE001 - an outage must degrade the step, not stop training
        logger.warning("teacher request failed (%s); continuing without it", err)
        return fallback
