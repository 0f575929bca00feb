"""GRPO-CARE (``reward_term: grpo_care``): a consistency bonus on correct rollouts, from an EMA reference copy of
the student. The arithmetic and the reference are :mod:`zppo_trl.consistency`'s."""

from __future__ import annotations

from typing import Any

from ..needs import COPY_EMA, Needs
from .base import Description, Term, register_term

__all__ = ["CARE_REFERENCE_NAME", "GRPOCare"]

CARE_REFERENCE_NAME = "care_reference.pt"  # GRPO-CARE's EMA weights in a checkpoint


@register_term
class GRPOCare(Term):
    selector = "reward_term"
    name = "grpo_care"
    printed = "GRPO-CARE"
    needs = Needs(student_copies=frozenset({(CARE_REFERENCE_NAME, COPY_EMA)}), plain_pipeline_only=True)

    @classmethod
    def describe(cls, args: Any) -> Description:
        return Description(
            plan=(
                f"  reward term: GRPO-CARE's consistency bonus ({args.care_bonus_coefficient:g} x reward), from an "
                f"EMA copy of the student on every rank (decay {args.care_ema_decay:g} every {args.care_ema_every} "
                "updates; a second set of weights: ZeRO-2 or DDP, not FSDP/ZeRO-3)",
            ),
            card=(
                f"Correct rollouts whose answer an EMA copy of the student finds most likely gain GRPO-CARE's "
                f"consistency bonus ({args.care_bonus_coefficient:g} x reward) in the advantages only."
            ),
        )
