"""The seam for named terms: a comparison row that is GRPO† plus one named part (GRPO-CARE's bonus, RLKD's
structure reward, SDPO's self-teacher, ReLIFT's teacher targets, ...).

A :class:`Term` is registered under the config field that selects it (``selector``) and its value there
(``name``). Its class declares what it asks of the run (:class:`zppo_trl.needs.Needs`), its settings (a dataclass of
the fields only it reads, mixed into :class:`zppo_trl.ZPPOConfig`), its checks and what it says in the dry run and
the model card. An instance is the term at run time: the trainer makes one per selected term with a
:class:`TermContext` (what the trainer offers it) and calls its hooks at fixed points of Algorithm 1:

- :meth:`Term.after_plain`, once the plain round is scored (between steps 3 and 6): a :class:`Contribution`
  (rewards added for the advantages only, per-row fields on the plain batch, teacher-forced target rows, metrics);
- :meth:`Term.partition_signal`, per optimizer partition (step 6): the rows it marks and advantages it adds;
- :meth:`Term.prepare_loss`, :meth:`Term.advantages`, :meth:`Term.loss_term`, per micro-batch (the loss);
- :meth:`Term.state_dict` / :meth:`Term.load_state_dict` and :attr:`Term.copies`, in every checkpoint.

:func:`terms_for` gives a configuration's terms in registry order; nothing outside :mod:`zppo_trl.terms` names a
term or a term's field.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..augmentations.base import teacher_results
from ..description import Description
from ..needs import Needs

__all__ = [
    "TERMS",
    "Contribution",
    "Description",
    "PlainStep",
    "Term",
    "TermContext",
    "TermSelectors",
    "added_rewards",
    "register_term",
    "selected_by",
    "settings_fields",
    "teacher_references",
    "terms_for",
]


@dataclass
class PlainStep:
    """The step as a term sees it after the plain round: step 1's draw (:class:`zppo_trl.rollout.Draw`), the scored
    plain round with its correctness rewards (:class:`zppo_trl.rollout.Round`), step 2's teacher Future (None
    where no teacher was sampled) and the step's metrics (timings a context function records go there)."""

    draw: Any
    round: Any
    teacher_future: Any
    metrics: dict


@dataclass
class Contribution:
    """What a term adds to the step after the plain round.

    Attributes:
        rewards: float64 amounts added to every rank's plain rewards (shaped like ``Round.rewards``), for the
            advantages only: never the plain accuracy, never the buffer.
        fields: per-row tensors put on this rank's plain batch (micro-batch fields the term's loss reads).
        targets: teacher-forced target rows (:class:`zppo_trl.augmentations.BuiltGroups`), each trained in its
            question's partition.
        metrics: the term's step metrics, already totalled over ranks where they are counts.
    """

    rewards: torch.Tensor | None = None
    fields: Mapping[str, torch.Tensor] = field(default_factory=dict)
    targets: Any = None
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass
class TermContext:
    """What the trainer offers a term (as :class:`zppo_trl.augmentations.AugmentationInputs` does an augmentation).

    Attributes:
        args: the configuration. ranks: :class:`zppo_trl.ranks.Ranks`. tokenizer: the student's.
        group_size: G_S. temperature: the sampling temperature. rng: the step's shared RNG (every rank alike).
        dataset: the training dataset. row: key -> its dataset row. question: row -> its question's text, without
            block or closer, whatever the dataset's format (:mod:`zppo_trl.dataset_formats`).
        teacher_chat: (row, text or None) -> a conversation for a server (the row's images, then the text).
        grade: (rows, replies per row) -> verdicts, by the trainer's reward functions.
        evidence: (step, keys) -> step 4's :class:`~zppo_trl.augmentations.Evidence` on those questions.
        student_copy: (decay, every, what) -> an :class:`~zppo_trl.terms.grpo_care.EMAReference` of the student on
            this rank's device, moved after optimizer steps (decay 1: frozen).
        judge: () -> a judge client of the run's (its request counts logged under ``zppo/judge/``).
        teacher: the teacher server's client (None where the row uses none).
        distill_teacher: the teacher loaded next to the student (None: its scores come from its server).
        tokenize_prompts: conversations -> their prompt token ids, as the student's prompts are tokenized.
        token_types: token ids -> the image/video placeholder types TRL marks.
        autocast: () -> the accelerator's autocast context.
    """

    args: Any
    ranks: Any
    tokenizer: Any
    group_size: int
    temperature: float
    rng: Any
    dataset: Any
    row: Callable[[Hashable], Mapping]
    question: Callable[[Mapping], str]
    teacher_chat: Callable[[Mapping, str | None], list]
    grade: Callable[[Sequence[Mapping], Sequence[Sequence[str]]], list[list[bool]]]
    evidence: Callable[[PlainStep, Sequence[Hashable]], Any]
    student_copy: Callable[[float, int, str], Any]
    judge: Callable[[], Any]
    teacher: Any
    distill_teacher: Any
    tokenize_prompts: Callable[[list], list]
    token_types: Callable[[torch.Tensor], torch.Tensor]
    autocast: Callable[[], Any]


class Term:
    """A named term added to GRPO† (the paper's comparison rows of that shape).

    Class attributes:
        selector: the config field that selects it (``"reward_term"``, ``"zero_variance_signal"``); an objective's
            own term (the self-teachers') says ``"policy_objective"`` and is registered with its loss
            (:func:`zppo_trl.losses.register_loss`'s ``term``), not here.
        name: its value there.
        printed: how the paper's tables print the row (``"GRPO-CARE"``; the row is ``GRPO-CARE†``).
        needs: what it asks of the run.
        settings: the dataclass of the config fields only it reads (its family's), mixed into ``ZPPOConfig``.
        scores_only: the micro-batch field marking the rows the teacher scores for it (None: every trained row).
        reads: the settings fields this term reads (the config warns about one set on a row that reads none).
        qualifies: on a row it does not rename, the term is a qualifier of its name (``ZPPO (LENS)``) rather than a
            suffix (``GRPO\u2020+BCQ (GRPO-CARE)``).
    """

    selector: ClassVar[str]
    name: ClassVar[str]
    printed: ClassVar[str]
    needs: ClassVar[Needs] = Needs()
    settings: ClassVar[type | None] = None
    scores_only: ClassVar[str | None] = None

    reads: ClassVar[tuple[str, ...]] = ()
    qualifies: ClassVar[bool] = False

    @classmethod
    def check_settings(cls, args: Any) -> None:
        """Refuse a bad value of one of its settings (whatever the row: a set field must be valid)."""

    @classmethod
    def validate(cls, args: Any) -> None:
        """Refuse a configuration this term cannot train (its combinations; its settings' ranges are checked by
        :meth:`check_settings` whatever the row)."""

    @classmethod
    def describe(cls, args: Any) -> Description:
        """Its dry-run lines and card sentence for the configuration ``args``."""
        return Description()

    def __init__(self, args: Any, ctx: TermContext):
        self.args, self.ctx = args, ctx

    @property
    def copies(self) -> list[tuple[str, Any, str]]:
        """The copies of the student it keeps: ``(checkpoint file, EMAReference, what it is)``."""
        return []

    @property
    def clients(self) -> list[tuple[str, Any]]:
        """Its own server clients by role (``"judge"``), their request counts logged under ``zppo/<role>/``."""
        return []

    def after_plain(self, step: PlainStep) -> Contribution | None:
        """Its contribution once the plain round is scored (None: nothing)."""
        return None

    def partition_signal(
        self, rewards: Sequence[float], group_ids: Sequence[Hashable], confidences: Sequence[float] | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One partition's ``(marked rows, extra advantages)`` (both (N,)); None: nothing."""
        return None

    def partition_reads(self, batch: Mapping) -> list[float] | None:
        """What its :meth:`partition_signal` reads of each of this rank's rows of the step's batch (gathered over
        ranks and passed as ``confidences``); None: nothing."""
        return None

    def prepare_loss(self, model: Any, inputs: Mapping, loss_inputs: Any) -> None:
        """Put what the objective reads of this term on ``loss_inputs`` (a :class:`zppo_trl.losses.LossInputs`)."""

    def advantages(self, loss_inputs: Any, inputs: Mapping) -> torch.Tensor | None:
        """The advantages the loss trains with instead of ``loss_inputs.advantages`` (None: unchanged)."""
        return None

    def loss_term(
        self, inputs: Mapping, loss_inputs: Any, distill_inputs: Callable[[], Any]
    ) -> tuple[torch.Tensor, dict] | None:
        """A term added to the objective's loss on this micro-batch, with its logged means (None: nothing)."""
        return None

    def state_dict(self) -> dict:
        """Its checkpoint state (JSON-serialisable), merged into ``zppo_state.json``."""
        return {}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict` from a checkpoint's state (keys it did not write are absent)."""


@dataclass(kw_only=True)  # after GRPOConfig's positional output_dir in ZPPOConfig
class TermSelectors:
    """The :class:`zppo_trl.ZPPOConfig` fields that select a term besides ``policy_objective`` (the objective
    registry's): the reward terms and the zero-variance signals."""

    reward_term: str = field(
        default="none",
        metadata={
            "help": "A named term added to the correctness reward before the advantages: 'none' (the paper's) or "
            "'grpo_care' (GRPO-CARE: a consistency bonus for correct rollouts whose answer an EMA copy of the student "
            "finds at least as likely, given their reasoning, as their group's correct peers do; see care_*), or "
            "'perception_r1' (Perception-R1: perception_reward_weight times the fraction of a question's "
            "visual_annotations the judge finds stated in the rollout), or 'rlkd' (RLKD: rlkd_reward_weight times "
            "how many of the teacher's reasoning steps the rollout's reasoning follows, as the judge decomposes and "
            "compares them). On GRPO†'s pipeline (augmentations: []). See docs/comparison_rows.md."
        },
    )
    zero_variance_signal: str = field(
        default="none",
        metadata={
            "help": "A signal for the all-wrong groups, which the two-step advantage leaves at zero: 'none' (the "
            "paper's ZPPO and GRPO), 'rl_zvp' (RL-ZVP: -alpha (max entropy - token entropy) per token), 'lens' "
            "(LENS: a penalty that grows with the sampling policy's length-normalised likelihood of each wrong "
            "answer, de-meaned in its group; needs num_partitions >= 2), or a teacher target on those questions: "
            "'relift' (ReLIFT: cross-entropy on one graded-correct teacher rollout per all-wrong question) or "
            "'rstg' (RSTG: the distillation rows' JSD to the teacher server's top-k on the all-wrong rollouts "
            "only). The group is then not skipped as empty-signal. See docs/comparison_rows.md."
        },
    )


# Every registered term, in registration order (the order their run-time parts apply in).
TERMS: dict[tuple[str, str], type[Term]] = {}


def register_term(cls: type[Term]) -> type[Term]:
    """Register a :class:`Term` subclass under ``(cls.selector, cls.name)`` (a class decorator); a selector of
    :class:`TermSelectors` only (an objective's term is registered with its loss)."""
    if cls.selector not in TermSelectors.__dataclass_fields__:
        raise ValueError(
            f"term {cls.__name__}: selector {cls.selector!r} is not one of {list(TermSelectors.__dataclass_fields__)} "
            "(an objective's own term is registered with its loss: register_loss(..., term=))"
        )
    key = (cls.selector, cls.name)
    if key in TERMS:
        raise ValueError(f"a term {cls.selector}={cls.name!r} is already registered ({TERMS[key].__name__})")
    TERMS[key] = cls
    return cls


def selected_by(selector: str) -> dict[str, type[Term]]:
    """The terms one config field selects: its value -> the term."""
    return {name: cls for (field_name, name), cls in TERMS.items() if field_name == selector}


def terms_for(args: Any) -> tuple[type[Term], ...]:
    """The named terms configuration ``args`` selects, in registry order (its objective's own term is its loss's:
    :attr:`zppo_trl.row.Row.terms` holds both)."""
    return tuple(cls for (selector, name), cls in TERMS.items() if getattr(args, selector, None) == name)


def settings_fields(cls: type[Term]) -> tuple[str, ...]:
    """The config fields of a term's settings (none without a settings dataclass)."""
    settings = cls.settings
    return tuple(settings.__dataclass_fields__) if settings is not None else ()


def added_rewards(
    ctx: TermContext, plain_round: Any, positions: Sequence[int], scores: Sequence[float | None], weight: float
) -> torch.Tensor:
    """Every rank's rewards' increment (float64, shaped like ``plain_round.rewards``): ``weight`` times each score
    at this rank's rollout ``positions`` (None: nothing), every rank's scores gathered, so every rank adds the
    same."""
    local = [0.0] * len(plain_round.texts)
    for i, score in zip(positions, scores):
        local[i] = score or 0.0
    rewards = plain_round.rewards.view(ctx.ranks.world, -1)
    extra = torch.tensor(ctx.ranks.gather(local), dtype=rewards.dtype, device=rewards.device)
    return (weight * extra).view(-1)


def teacher_references(
    ctx: TermContext, teacher_future: Any, real: Sequence[Any], skip: Callable[[Any], bool] | None = None
) -> list[str | None]:
    """Per real group of this rank (in the order the teacher was asked), the teacher's first reply to its question
    that the trainer's reward grades correct, or None (and None, ungraded, for a group ``skip`` marks): OPSD's
    privileged trace and RLKD's teacher trace."""
    replies = teacher_results(teacher_future, [[] for _ in real])
    replies = [[] if skip is not None and skip(group) else texts for group, texts in zip(real, replies)]
    grades = ctx.grade([group.row for group in real], replies)
    return [next((text for text, right in zip(texts, ok) if right), None) for texts, ok in zip(replies, grades)]
