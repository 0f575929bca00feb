"""The hybrid RL + distillation rows: Step 6 objectives that route the frozen teacher back through the gradient.

The paper's appendix on teacher-side alternatives adds each named term on the GRPO† pipeline ("three rows route
an external teacher back through the gradient"). Two of them are a change to Step 6's loss alone, so they are
policy objectives here (``policy_objective: kdrl`` / ``rlad`` with ``augmentations: []`` is the paper's
``KDRL†`` / ``RLAD†``). Both read the teacher's log-prob of every sampled token of the student's own rollouts,
``log pi_T(o_t | q, o_<t)``, teacher-forced: its vLLM server's ``prompt_logprobs`` by default, or a teacher loaded
next to the student (``distill_teacher``).

========  =============================================================================================
``kdrl``  Xu et al. 2025, "KDRL: Post-Training Reasoning LLMs via Unified Knowledge Distillation and
          Reinforcement Learning" (arXiv 2506.02208): ``J_GRPO - beta_t KL(pi_theta || pi_T)``, the reverse KL
          estimated per sampled token with k2, ``0.5 (log pi_theta - log pi_T)^2`` (gradient
          ``(log pi_theta - log pi_T) grad log pi_theta``), averaged over the update's tokens as the GRPO term
          is, no importance weight on it. ``beta_t = max(start - decay * step, end)`` (its annealed
          schedule, the best-scoring variant: 5e-3 falling by 5e-5 per optimizer step to 1e-3;
          :func:`kdrl_coefficient`). The term acts on every rollout, those of zero-variance groups too (their
          advantage is 0, their reverse KL is not), so no partition is skipped for want of a signal. Its
          reward-guided masking variant is not the row.
``rlad``  Zhang et al. 2026, "Reinforcement-aware Knowledge Distillation for LLM Reasoning" (arXiv
          2602.22495), Trust Region Ratio Distillation: GRPO's clipped surrogate with each token's ratio taken
          against a geometric mixture of the old policy and the teacher,
          ``log r = alpha (log pi_theta - log pi_old) + (1 - alpha) clamp(log pi_theta - log pi_T, -b, b)``
          (its Eq. 5, with its appendix's bound b = 1 on the teacher log-ratio); alpha 0.5
          (:func:`rlad_log_ratio`). No separate teacher KL term: the teacher acts only through the clip.
========  =============================================================================================

Every other setting is the paper's: the DAPO token-level clipped surrogate with clip-higher and the dual clip.
This module is pure: torch only, no TRL, no trainer.
"""

from __future__ import annotations

from typing import Any

import torch

from .losses import LossInputs, LossOutput, _clipped_surrogate, _epsilons, _old_logps, dapo_loss, register_loss
from .needs import SCORES_TOKEN_LOGPS, Needs

__all__ = ["kdrl_coefficient", "kdrl_k2", "kdrl_loss", "rlad_log_ratio", "rlad_loss"]


def kdrl_coefficient(args: Any, step: int) -> float:
    """KDRL's reverse-KL weight after ``step`` optimizer steps: ``max(kdrl_beta - kdrl_beta_decay * step,
    kdrl_beta_min)`` (a constant ``kdrl_beta`` when the decay is 0)."""
    return max(args.kdrl_beta - args.kdrl_beta_decay * step, args.kdrl_beta_min)


def kdrl_k2(logps: torch.Tensor, teacher_logps: torch.Tensor) -> torch.Tensor:
    """The k2 estimate of ``KL(pi_theta || pi_T)`` at each sampled token, ``0.5 (log pi_theta - log pi_T)^2``;
    the teacher's log-prob is a constant."""
    return 0.5 * (logps - teacher_logps.detach()) ** 2


def _teacher_logps(inputs: LossInputs, name: str) -> torch.Tensor:
    if inputs.teacher_logps is None:
        raise ValueError(f"policy_objective={name!r} reads the teacher's log-prob of every sampled token")
    return inputs.teacher_logps


# the reverse KL acts on every rollout, so a partition whose groups all have zero advantage still trains
@register_loss(
    "kdrl",
    objective="kdrl",
    printed="KDRL",
    dual_clip=True,
    needs=Needs(teacher_scores=frozenset({SCORES_TOKEN_LOGPS}), trains_zero_advantage=True),
    reads=("kdrl_beta", "kdrl_beta_decay", "kdrl_beta_min"),
)
def kdrl_loss(inputs: LossInputs, args: Any) -> LossOutput:
    """GRPO's objective plus ``beta_t`` times the k2 reverse-KL to the teacher, both a token mean over the update;
    logs the mean k2 (``kdrl/reverse_kl``) and the weight it trained with (``kdrl/beta``)."""
    out = dapo_loss(inputs, args)
    k2 = kdrl_k2(inputs.logps, _teacher_logps(inputs, "kdrl"))
    total = (k2 * inputs.mask).sum()
    beta = kdrl_coefficient(args, inputs.step)
    out.loss = out.loss + beta * total / inputs.normalizer
    count = inputs.mask.sum().to(torch.float64)
    out.means["kdrl/reverse_kl"] = (total.detach().to(torch.float64), count)
    out.means["kdrl/beta"] = (count * beta, count)
    return out


def rlad_log_ratio(
    logps: torch.Tensor, old_logps: torch.Tensor, teacher_logps: torch.Tensor, alpha: float, bound: float
) -> torch.Tensor:
    """RLAD's per-token log-ratio against the mixture ``pi_old^alpha pi_T^(1 - alpha)``:
    ``alpha (log pi - log pi_old) + (1 - alpha) clamp(log pi - log pi_T, -bound, bound)``. Outside the bound the
    teacher part is constant (no gradient through it), as a clamp is."""
    teacher_part = torch.clamp(logps - teacher_logps.detach(), -bound, bound)
    return alpha * (logps - old_logps.detach()) + (1 - alpha) * teacher_part


@register_loss(
    "rlad",
    objective="rlad",
    printed="RLAD",
    dual_clip=True,
    needs=Needs(teacher_scores=frozenset({SCORES_TOKEN_LOGPS})),
    reads=("rlad_alpha", "rlad_teacher_log_ratio_bound"),
)
def rlad_loss(inputs: LossInputs, args: Any) -> LossOutput:
    """GRPO's clipped surrogate (clip-higher, dual clip) on RLAD's mixture ratio; logs the mean teacher log-ratio
    ``log pi - log pi_T`` (``rlad/teacher_log_ratio``) before its clamp."""
    teacher = _teacher_logps(inputs, "rlad")
    log_ratio = rlad_log_ratio(
        inputs.logps, _old_logps(inputs), teacher, args.rlad_alpha, args.rlad_teacher_log_ratio_bound
    )
    out = _clipped_surrogate(inputs, args, log_ratio, _epsilons(args))
    gap = (inputs.logps.detach() - teacher.detach()).to(torch.float64)
    out.means["rlad/teacher_log_ratio"] = ((gap * inputs.mask).sum(), inputs.mask.sum().to(torch.float64))
    return out
