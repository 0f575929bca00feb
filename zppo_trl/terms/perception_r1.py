"""Perception-R1 (``reward_term: perception_r1``): a judge's fraction of a question's visual annotations each rollout
states, added to its reward. The prompt, parser and reward are :mod:`zppo_trl.perception`'s."""

from __future__ import annotations

from typing import Any

from ..needs import Needs
from .base import Description, Term, register_term

__all__ = ["PerceptionR1"]


@register_term
class PerceptionR1(Term):
    selector = "reward_term"
    name = "perception_r1"
    printed = "Perception-R1"
    needs = Needs(judge=True, plain_pipeline_only=True)

    @classmethod
    def describe(cls, args: Any) -> Description:
        return Description(
            plan=(
                f"  reward term: Perception-R1's perception reward ({args.perception_reward_weight:g} x the fraction "
                f"of a question's visual_annotations stated), judged by {args.judge_model} at {args.judge_base_url}",
            ),
            card=(
                f"A judge's fraction of each question's visual annotations a rollout states is added to its reward "
                f"(weight {args.perception_reward_weight:g}; Perception-R1), in the advantages only."
            ),
        )
