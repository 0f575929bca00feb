"""The self-teacher rows (``policy_objective: sdpo|opsd``): a copy of the student shown privileged context, distilled
back into it on its own rollouts. The contexts, the term's loss and the signal they need are
:mod:`zppo_trl.self_distillation`'s."""

from __future__ import annotations

from typing import Any

from ..needs import COPY_EMA, COPY_FROZEN, Needs
from .base import Description, Term, register_term

__all__ = ["OPSD", "SDPO", "SELF_TEACHER_NAME"]

SELF_TEACHER_NAME = "self_teacher.pt"  # SDPO's / OPSD's self-teacher in a checkpoint


@register_term
class SDPO(Term):
    selector = "policy_objective"
    name = "sdpo"
    printed = "SDPO"
    needs = Needs(student_copies=frozenset({(SELF_TEACHER_NAME, COPY_EMA)}), plain_pipeline_only=True)

    @classmethod
    def describe(cls, args: Any) -> Description:
        return Description(
            plan=(
                f"  self-teacher (SDPO): an EMA copy of the student on every rank, shown a correct sibling rollout "
                f"(rate {args.sdpo_teacher_update_rate:g} per update; term weight {args.self_distill_weight:g}; a "
                "second set of weights: ZeRO-2 or DDP, not FSDP/ZeRO-3)",
            ),
            card=(
                "Each rollout is distilled towards an EMA copy of the student shown a correct sibling rollout "
                f"(SDPO's self-teacher; term weight {args.self_distill_weight:g})."
            ),
        )


@register_term
class OPSD(Term):
    selector = "policy_objective"
    name = "opsd"
    printed = "OPSD"
    needs = Needs(
        teacher_samples=True, student_copies=frozenset({(SELF_TEACHER_NAME, COPY_FROZEN)}), plain_pipeline_only=True
    )

    @classmethod
    def describe(cls, args: Any) -> Description:
        return Description(
            plan=(
                "  self-teacher (OPSD): the initial student, frozen, on every rank, shown the teacher's "
                f"graded-correct reply (JSD beta={args.opsd_beta:g} over its top {args.opsd_top_k}; term weight "
                f"{args.self_distill_weight:g}; a second set of weights: ZeRO-2 or DDP, not FSDP/ZeRO-3)",
            ),
            card=(
                "Each rollout is distilled towards the initial student, frozen, shown the teacher's graded-correct "
                f"reply (OPSD's self-teacher; term weight {args.self_distill_weight:g})."
            ),
            teacher_use=("a question's first graded-correct answer is shown to the self-teacher",),
        )
