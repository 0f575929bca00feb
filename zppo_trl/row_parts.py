"""What :class:`zppo_trl.ZPPOTrainer` offers the parts of its row, as a mixin: the teacher's server client and the
teacher loaded next to the student where the row's needs ask for them, the copies of the student a term keeps, the
step-5 augmentation, each term's context, and the terms' contributions applied to the plain round.
"""

from __future__ import annotations

from typing import Any

from trl.models import prepare_deepspeed, prepare_fsdp

from . import data
from .augmentations import Augmentation, make_augmentation
from .callbacks import EMAReferenceCallback
from .distill import frozen_distill_teacher
from .rollout import Round
from .student_copy import EMAReference
from .teacher import TeacherClient
from .terms import PlainStep, TermContext

__all__ = ["RowParts"]


class RowParts:
    """A mixin of :class:`zppo_trl.ZPPOTrainer` (see the module's docstring)."""

    def _prepare_distill_teacher(self, model: Any) -> Any:
        """``model`` (or ``args.distill_teacher`` loaded like the student), frozen and placed as TRL places
        its reference model; its vocabulary must cover the student's tokenizer."""
        teacher = frozen_distill_teacher(model, self.args.distill_teacher, self.model, self._tokenizer)
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(teacher, self.accelerator)
        if self.is_fsdp_enabled:
            return prepare_fsdp(teacher, self.accelerator)
        return self.accelerator.prepare_model(teacher, evaluation_mode=True)

    def _prepare_ema_copy(self, decay: float, every: int, row: str) -> EMAReference:
        """An EMA copy of the student (GRPO-CARE's reference, the self-teachers): a full copy of its weights on
        this rank's device, moved towards the student after every ``every``-th optimizer step (a callback; none
        when ``decay`` is 1, a frozen copy). FSDP and ZeRO-3 shard the weights it would copy: refused, naming the
        ``row``'s setting."""
        deepspeed = getattr(self.accelerator.state, "deepspeed_plugin", None)
        if self.is_fsdp_enabled or (deepspeed is not None and deepspeed.zero_stage == 3):
            raise ValueError(
                f"{row} keeps a full EMA copy of the student's weights on every rank, which FSDP and ZeRO-3 shard: "
                "launch it with DDP or ZeRO-2 (recipes/accelerate_configs/zero2.yaml)"
            )
        reference = EMAReference(self.model, decay, every)
        reference.model.to(self.accelerator.device)
        if decay < 1.0:
            self.add_callback(EMAReferenceCallback(reference))
        return reference

    def _prepare_teachers(self, teacher: TeacherClient | None, distill_teacher_model: Any) -> tuple[Any, Any]:
        """The teacher server's client (``teacher`` as given, or one from ``args.teacher_*`` where the row talks to the
        server) and the teacher loaded next to the student (None: its scores come from the server)."""
        row = self.row
        local = bool(row.needs.teacher_scores) and (distill_teacher_model is not None or row.loads_teacher)
        if teacher is None and row.needs_teacher_server(local):
            teacher = TeacherClient.from_config(self.args)
        return teacher, self._prepare_distill_teacher(distill_teacher_model) if local else None

    def _term_context(self) -> TermContext:
        """What the trainer offers a term (zppo_trl.terms.TermContext)."""
        return TermContext(
            args=self.args,
            ranks=self.ranks,
            tokenizer=self._tokenizer,
            group_size=self.num_generations,
            temperature=self.temperature,
            rng=self._rng,
            dataset=self.train_dataset,
            row=self._row,
            question=self.dataset_format.question,
            teacher_chat=self._teacher_conversation,
            grade=self._grade_many,
            evidence=lambda step, keys: self._gather_evidence(
                step.teacher_future, step.draw, step.round, keys, step.metrics
            ),
            student_copy=self._prepare_ema_copy,
            judge=lambda: TeacherClient.from_config(self.args, role="judge"),
            teacher=self.teacher,
            distill_teacher=self.distill_teacher,
            tokenize_prompts=lambda conversations: self._tokenize_prompts(conversations)[0],
            token_types=self._token_types,
            autocast=self.accelerator.autocast,
        )

    def _make_augmentation(self) -> Augmentation | None:
        """Step 5's augmentation of the configuration, made with what the trainer offers it (None: none)."""
        args = self.args
        return make_augmentation(
            args.augmentations,
            prefix_fraction=args.prefix_fraction,
            tokenizer=self._tokenizer,
            question_of=lambda key: self.dataset_format.question(self._row(key)),
            teacher_chat=lambda key, text: self._teacher_conversation(self._row(key), text),
            grade=lambda keys, texts: self._grade_many([self._row(key) for key in keys], texts),
            answer_of=lambda key: self._row(key)[data.ANSWER],
            bcq_candidate_content=args.bcq_candidate_content,
        )

    def _with_terms(self, step: PlainStep) -> tuple[Round, Round | None]:
        """The plain round with every term's contribution (:meth:`zppo_trl.terms.Term.after_plain`, in registry
        order, each on the correctness rewards): their rewards added for the advantages (never the plain accuracy or
        the buffer), their fields put on the plain batch; and the target round of their teacher-forced rows."""
        plain_round, batch, rewards, targets = step.round, None, step.round.rewards, None
        for term in self.terms:
            contribution = term.after_plain(step)
            if contribution is None:
                continue
            step.metrics.update(contribution.metrics)
            if contribution.rewards is not None:
                rewards = rewards + contribution.rewards
            if contribution.fields:
                batch = {**(batch or plain_round.batch), **contribution.fields}
            if contribution.targets is not None:
                targets = self._target_round(contribution.targets, step.draw.plain[0].row, step.metrics)
        shaped = Round(batch or plain_round.batch, rewards, plain_round.texts, plain_round.groups_per_rank)
        return shaped, targets
