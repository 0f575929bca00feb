"""RLKD (``reward_term: rlkd``): a reasoning-structure reward, the judge (as RLKD's GSRM) comparing each rollout's
decomposed reasoning with the teacher's first graded-correct reply. The prompts, parser and reward are
:mod:`zppo_trl.structure_reward`'s."""

from __future__ import annotations

from typing import Any

from ..needs import Needs
from .base import Description, Term, register_term

__all__ = ["RLKD"]


@register_term
class RLKD(Term):
    selector = "reward_term"
    name = "rlkd"
    printed = "RLKD"
    needs = Needs(teacher_samples=True, judge=True, plain_pipeline_only=True)

    @classmethod
    def describe(cls, args: Any) -> Description:
        return Description(
            plan=(
                f"  reward term: RLKD's structure reward ({args.rlkd_reward_weight:g} x the teacher's reasoning steps "
                f"the rollout follows), a question keeping the teacher's first reply graded correct; "
                f"{args.judge_model} at {args.judge_base_url} decomposes (replies <= {args.rlkd_gsrm_max_tokens:,} "
                "tokens: its --max-model-len must hold a reply plus that) and judges",
            ),
            card=(
                "A judge decomposes each rollout's reasoning and the teacher's first graded-correct reply into "
                f"steps; the steps the rollout shares with the teacher's are added to its reward (weight "
                f"{args.rlkd_reward_weight:g}; RLKD), in the advantages only."
            ),
            teacher_use=("a question's first graded-correct answer is its reasoning reference",),
        )
