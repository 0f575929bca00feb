"""The self-teacher rows: the student, given privileged context, distilled back into itself on its own rollouts.

The paper's appendix on teacher-side alternatives has two rows whose teacher is the student itself, each a named
term on the GRPO† pipeline (replay buffer, no BCQ/NCQ). SDPO (Hübotter et al. 2026, "Reinforcement Learning via
Self-Distillation", arXiv 2601.20802) "conditions a self-teacher on rollout feedback and distills that teacher
back into the student on its own rollouts" (``policy_objective: sdpo``):

1. The context. A rollout's self-teacher prompt is its plain prompt followed by a correct rollout of the same
   group, never itself: the first other rollout with a correct answer, its reasoning block removed, in the
   official code's templates (:data:`SDPO_REPROMPT`, :data:`SDPO_SOLUTION`; the YAML its experiments ran, which
   has no trailing newlines). A rollout whose group has no other correct rollout has no self-teacher and leaves
   the term (its mask is 0). The corpus gives no textual environment feedback, so ``{feedback}`` is empty, as in
   SDPO's runs without rich feedback.
2. The teacher. A copy of the initial student, moved towards the student after every optimizer step,
   ``theta_T <- (1 - rate) theta_T + rate theta`` with the official default rate 0.05. Its log-prob of each
   sampled token, teacher-forced after the self-teacher prompt, is computed once per rollout step, before the
   step's updates (as the old log-probs are).
3. The term. The sampled-token reverse KL, TRL's experimental SDPO default: per sampled token
   ``sg(log pi_theta - log pi_T) log pi_theta`` (its gradient is the reverse KL's at that token), weighted by the
   importance ratio to the sampling policy, stopped from the gradient and capped at 2
   (``sg(min(pi_theta / pi_old, 2))``). It is added to GRPO's objective with weight ``self_distill_weight``
   (1), summed over the self-distilled tokens and divided by the update's loss-token count as GRPO's term is.

Choices where SDPO leaves the row open (docs/comparison_rows.md says the same): the official default divergence is
a top-100-logit JSD (alpha 0.5) and the official loss replaces the policy gradient; this row keeps GRPO's objective
(the paper's "adds a named term") and uses the sampled-token form, which needs only one teacher log-prob per token.

This module is pure: torch and the prompt helpers only, no TRL, no trainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .losses import LossInputs, LossOutput, _old_logps, dapo_loss, register_loss
from .teacher import strip_thinking

__all__ = [
    "SDPO_IS_CLIP",
    "SDPO_REPROMPT",
    "SDPO_SOLUTION",
    "SDPO_TEACHER_UPDATE_RATE",
    "sdpo_context",
    "sdpo_demonstrations",
    "self_distillation_per_token",
]

# SDPO's official reprompt templates (lasgroup/SDPO, the actor YAML its experiments ran), word for word.
SDPO_REPROMPT = "{prompt}{solution}{feedback}\n\nCorrectly solve the original question."
SDPO_SOLUTION = "\nCorrect solution:\n\n{successful_previous_attempt}"
# SDPO's official defaults: the EMA teacher's update rate per optimizer step, and the importance-ratio cap.
SDPO_TEACHER_UPDATE_RATE = 0.05
SDPO_IS_CLIP = 2.0


def sdpo_demonstrations(correct: Sequence[bool], group_size: int) -> list[int | None]:
    """For each rollout (groups of ``group_size`` in a row), the index of the first *other* correct rollout of its
    group, or None when its group has none: SDPO's successful demonstration, never the rollout itself."""
    if len(correct) % group_size:
        raise ValueError(f"{len(correct)} rollouts do not form groups of {group_size}")
    demonstrations: list[int | None] = []
    for i in range(len(correct)):
        start = i - i % group_size
        others = (j for j in range(start, start + group_size) if j != i and correct[j])
        demonstrations.append(next(others, None))
    return demonstrations


def sdpo_context(prompt: str, demonstration: str) -> str:
    """The self-teacher's user message: the plain prompt's text, then the demonstration (its reasoning block
    removed, as the official runs do) in SDPO's solution template, then its closing instruction."""
    solution = SDPO_SOLUTION.format(successful_previous_attempt=strip_thinking(demonstration).strip())
    return SDPO_REPROMPT.format(prompt=prompt, solution=solution, feedback="")


def self_distillation_per_token(
    logps: torch.Tensor, teacher_logps: torch.Tensor, old_logps: torch.Tensor, is_clip: float | None
) -> torch.Tensor:
    """The sampled-token self-distillation loss per token, ``sg(log pi - log pi_T) log pi``, times
    ``sg(min(pi / pi_old, is_clip))`` (no weight when ``is_clip`` is None). Its gradient is
    ``(log pi - log pi_T) grad log pi``: each sampled token is pushed towards the self-teacher's probability."""
    per_token = (logps - teacher_logps).detach() * logps
    if is_clip is None:
        return per_token
    ratio = torch.exp(torch.clamp((logps - old_logps).detach(), -20.0, 20.0)).clamp(max=is_clip)
    return per_token * ratio


def _self_distillation_term(inputs: LossInputs, args: Any, is_clip: float | None, out: LossOutput) -> LossOutput:
    """``out`` (GRPO's objective) plus ``self_distill_weight`` times the term over the self-distilled tokens,
    divided by the update's token count; logs the mean sampled log-ratio ``log pi - log pi_T`` (an estimate of the
    reverse KL, ``self_distill/log_ratio``) and the share of loss tokens the term reached (``self_distill/tokens``)."""
    if inputs.teacher_logps is None or inputs.teacher_mask is None:  # a batch ZPPO did not build (TRL's evaluation)
        return out
    mask = inputs.mask * inputs.teacher_mask
    per_token = self_distillation_per_token(inputs.logps, inputs.teacher_logps, _old_logps(inputs), is_clip)
    out.loss = out.loss + args.self_distill_weight * (per_token * mask).sum() / inputs.normalizer
    gap = (inputs.logps.detach() - inputs.teacher_logps).to(torch.float64)
    count = mask.sum().to(torch.float64)
    out.means["self_distill/log_ratio"] = ((gap * mask).sum(), count)
    out.means["self_distill/tokens"] = (count, inputs.mask.sum().to(torch.float64))
    return out


# the term acts on rollouts of groups without a mixed reward too (an all-correct group's rollouts have siblings to
# learn from), so a partition with no advantage still trains
@register_loss("sdpo", objective="sdpo", printed="SDPO", dual_clip=True, self_teacher=True, trains_zero_advantage=True)
def sdpo_loss(inputs: LossInputs, args: Any) -> LossOutput:
    """GRPO's objective plus SDPO's sampled-token self-distillation to the EMA self-teacher, its importance ratio
    capped at ``sdpo_is_clip``."""
    return _self_distillation_term(inputs, args, args.sdpo_is_clip, dapo_loss(inputs, args))
