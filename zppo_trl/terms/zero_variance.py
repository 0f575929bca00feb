"""The zero-variance rows' terms (the paper's zero-variance table), selected by ``zero_variance_signal``: a signal
on the all-wrong groups of GRPO†, which it otherwise skips. RL-ZVP and LENS shape their advantages; ReLIFT and RSTG
put a teacher target in the loss. The arithmetic is :mod:`zppo_trl.zero_variance`'s."""

from __future__ import annotations

from typing import Any

from ..needs import SCORES_TOP_K, Needs
from ..zero_variance import ZERO_VARIANCE_SIGNALS
from .base import Description, Term, register_term

__all__ = ["LENS", "RLZVP", "RSTG", "ReLIFT"]


class _ZeroVarianceTerm(Term):
    selector = "zero_variance_signal"
    what = ""

    @classmethod
    def alpha(cls, args: Any) -> float:
        alpha = args.zero_variance_alpha
        return ZERO_VARIANCE_SIGNALS[cls.name].default_alpha if alpha is None else float(alpha)

    @classmethod
    def describe(cls, args: Any) -> Description:
        what = cls.what.format(alpha=cls.alpha(args))
        return Description(
            plan=(f"  zero-variance term ({cls.printed}): {what}",),
            card=f"The all-wrong groups, which GRPO\u2020 skips, train with {cls.printed}'s term: {what}.",
        )


@register_term
class RLZVP(_ZeroVarianceTerm):
    name = "rl_zvp"
    printed = ZERO_VARIANCE_SIGNALS[name].printed
    needs = Needs(token_level_objective=True)
    what = "an entropy-shaped negative advantage on every token of an all-wrong group (alpha {alpha:g})"


@register_term
class LENS(_ZeroVarianceTerm):
    name = "lens"
    printed = ZERO_VARIANCE_SIGNALS[name].printed
    needs = Needs(sampling_logps_at_scoring=True)
    what = "a confidence-weighted negative advantage on every all-wrong group (alpha {alpha:g})"


@register_term
class ReLIFT(_ZeroVarianceTerm):
    name = "relift"
    printed = ZERO_VARIANCE_SIGNALS[name].printed
    needs = Needs(teacher_samples=True)
    what = "cross-entropy on one graded-correct teacher solution per all-wrong question (weight {alpha:g})"

    @classmethod
    def describe(cls, args: Any) -> Description:
        base = super().describe(args)
        return Description(base.plan, base.card, ("one graded-correct answer per all-wrong question is a target",))


@register_term
class RSTG(_ZeroVarianceTerm):
    name = "rstg"
    printed = ZERO_VARIANCE_SIGNALS[name].printed
    needs = Needs(teacher_scores=frozenset({SCORES_TOP_K}))
    what = "the distillation JSD to the teacher on the rollouts of all-wrong groups (weight {alpha:g})"

    @classmethod
    def describe(cls, args: Any) -> Description:
        base = super().describe(args)
        return Description(base.plan, base.card, ("scores the all-wrong rollouts only",))
