"""What :class:`zppo_trl.ZPPOTrainer` builds for the parts of its row, as functions of what they take: the teacher's
server client and the teacher loaded next to the student where the row's needs ask for them
(:func:`prepare_teachers`), the copies of the student a term keeps (:func:`student_copy_maker`), and the terms'
contributions applied to the plain round (:func:`apply_terms`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from trl.models import prepare_deepspeed, prepare_fsdp

from .callbacks import EMAReferenceCallback
from .distill import frozen_distill_teacher
from .rollout import Round
from .student_copy import EMAReference
from .teacher import TeacherClient
from .terms import PlainStep

__all__ = ["apply_terms", "judge_client", "prepare_teachers", "student_copy_maker"]


def prepare_teachers(
    row: Any, args: Any, teacher: TeacherClient | None, distill_teacher_model: Any, *, student: Any, tokenizer: Any,
    accelerator: Any, deepspeed: bool, fsdp: bool,
) -> tuple[Any, Any]:  # fmt: skip
    """The teacher server's client (``teacher`` as given, or one from ``args.teacher_*`` where the row talks to the
    server) and the teacher loaded next to the student (None: its scores come from the server):
    ``distill_teacher_model`` or ``args.distill_teacher`` loaded like the student, frozen and placed as TRL places
    its reference model; its vocabulary must cover the student's tokenizer."""
    local = bool(row.needs.teacher_scores) and (distill_teacher_model is not None or row.loads_teacher)
    if teacher is None and row.needs_teacher_server(local):
        teacher = TeacherClient.from_config(args)
    if not local:
        return teacher, None
    loaded = frozen_distill_teacher(distill_teacher_model, args.distill_teacher, student, tokenizer)
    if deepspeed:
        return teacher, prepare_deepspeed(loaded, accelerator)
    if fsdp:
        return teacher, prepare_fsdp(loaded, accelerator)
    return teacher, accelerator.prepare_model(loaded, evaluation_mode=True)


def judge_client(terms: Sequence[Any], reward_funcs: Sequence[Any]) -> Any:
    """The run's judge, whose requests a step counts: the row's own (Perception-R1, RLKD: a term's ``clients``) or a
    reward function's (``judged_accuracy_reward``'s); None without one."""
    parts = [*(term.clients for term in terms), *(getattr(f, "clients", ()) for f in reward_funcs)]
    judges = [client for clients in parts for role, client in clients if role == "judge"]
    return judges[0] if judges else None


def student_copy_maker(
    student: Any, device: Any, *, sharded: bool, add_callback: Callable[[Any], None]
) -> Callable[[float, int, str], EMAReference]:
    """``(decay, every, row) -> EMAReference``: an EMA copy of the student (GRPO-CARE's reference, the self-teachers),
    a full copy of its weights on ``device``, moved towards the student after every ``every``-th optimizer step (a
    callback given to ``add_callback``; none when ``decay`` is 1, a frozen copy). FSDP and ZeRO-3 (``sharded``) shard
    the weights it would copy: refused, naming the ``row``'s setting."""

    def make(decay: float, every: int, row: str) -> EMAReference:
        if sharded:
            raise ValueError(
                f"{row} keeps a full EMA copy of the student's weights on every rank, which FSDP and ZeRO-3 shard: "
                "launch it with DDP or ZeRO-2 (recipes/accelerate_configs/zero2.yaml)"
            )
        reference = EMAReference(student, decay, every)
        reference.model.to(device)
        if decay < 1.0:
            add_callback(EMAReferenceCallback(reference))
        return reference

    return make


def apply_terms(
    terms: Sequence[Any], step: PlainStep, target_round: Callable[[Any, Any], Round]
) -> tuple[Round, Round | None]:
    """The plain round with every term's contribution (:meth:`zppo_trl.terms.Term.after_plain`, in registry
    order, each on the correctness rewards): their rewards added for the advantages (never the plain accuracy or
    the buffer), their fields put on the plain batch; and the target round of their teacher-forced rows
    (``target_round(built, filler_row)``)."""
    plain_round, batch, rewards, targets = step.round, None, step.round.rewards, None
    for term in terms:
        contribution = term.after_plain(step)
        if contribution is None:
            continue
        step.metrics.update(contribution.metrics)
        if contribution.rewards is not None:
            rewards = rewards + contribution.rewards
        if contribution.fields:
            batch = {**(batch or plain_round.batch), **contribution.fields}
        if contribution.targets is not None:
            targets = target_round(contribution.targets, step.draw.plain[0].row)
    shaped = Round(batch or plain_round.batch, rewards, plain_round.texts, plain_round.groups_per_rank)
    return shaped, targets
