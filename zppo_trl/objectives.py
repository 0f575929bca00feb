"""Step 6's policy objectives: their names, and the pieces of their formulas that are not TRL's.

The paper trains ZPPO with GRPO (the DAPO token-level clipped surrogate with the dual clip) and reports
three alternatives on the GRPO† pipeline, every other setting as in its hyperparameter table (the
appendix's objective comparison). With r = pi_theta / pi_old per token, A the rollout's advantage and
sg the stop-gradient:

- ``"grpo"``: ``min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``, and ``max(., c_dual A)`` for A < 0.
- ``"gspo"`` (Zheng et al. 2025, Group Sequence Policy Optimization): the same clipped surrogate
  on one ratio per rollout, ``s = exp(mean_t log r_t)`` (the length-normalised geometric mean).
- ``"cispo"`` (MiniMax-M1, Chen et al. 2025): clip the importance weight, not the update:
  ``sg(min(r, 1 + eps_high)) A log pi`` (no lower bound, as MiniMax-M1 trains it).
- ``"dispo"`` (Karaman et al. 2026): :func:`dispo_per_token_loss`.

The losses themselves are registered in :mod:`zppo_trl.losses`; ``zppo_trl.config`` maps each
objective onto TRL's fields. This module is pure: torch only, no TRL, no trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["OBJECTIVES", "OBJECTIVE_NAMES", "DUAL_CLIP_OBJECTIVES", "DispoBounds", "cispo_weight_bound", "dispo_outside", "dispo_per_token_loss"]

OBJECTIVES = ("grpo", "gspo", "cispo", "dispo")
# How the paper prints each objective (its table of policy objectives).
OBJECTIVE_NAMES = {"grpo": "GRPO", "gspo": "GSPO", "cispo": "CISPO", "dispo": "DISPO"}
# The objectives whose loss is the clipped surrogate, so the dual clip c_dual (TRL's delta) acts in them.
DUAL_CLIP_OBJECTIVES = ("grpo", "gspo")


def cispo_weight_bound(epsilon_high: float) -> float:
    """CISPO's upper bound on the importance weight: ``1 + eps_high`` (MiniMax-M1's clip).

    TRL's ``loss_type="cispo"`` clamps the weight at ``epsilon_high`` itself, an absolute bound
    (its docs recommend 5.0); with the paper's ``epsilon_high`` 0.28 that would cap every weight
    at 0.28. The trainer hands TRL this value instead.
    """
    return 1.0 + epsilon_high


@dataclass(frozen=True)
class DispoBounds:
    """DISPO's four clip epsilons: an interval ``[1 - low, 1 + high]`` on the importance weight
    for correct responses (``*_pos``, A > 0) and one for incorrect responses (``*_neg``, A < 0).

    A ``low`` of 1 or more leaves that side without a lower bound (a weight is never negative).
    ``ZPPOConfig`` validates the values (``dispo_epsilon_*``: finite, >= 0).
    """

    low_pos: float
    high_pos: float
    low_neg: float
    high_neg: float


def dispo_outside(ratio: torch.Tensor, advantages: torch.Tensor, bounds: DispoBounds) -> tuple[torch.Tensor, torch.Tensor]:
    """Where DISPO's trust region excludes a token: ``(below, above)`` boolean masks.

    ``below``: the weight is under ``1 - low`` of its response's side; ``above``: over ``1 + high``.
    The side is the advantage's sign (A > 0 correct, A < 0 incorrect: with binary rewards and
    group-relative advantages the two agree on every group with a signal); A = 0 tokens carry no
    gradient and are never counted as clipped. ``advantages`` broadcasts against ``ratio``.
    """
    pos, neg = advantages > 0, advantages < 0
    below = (pos & (ratio < 1 - bounds.low_pos)) | (neg & (ratio < 1 - bounds.low_neg))
    above = (pos & (ratio > 1 + bounds.high_pos)) | (neg & (ratio > 1 + bounds.high_neg))
    return below, above


def dispo_per_token_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    bounds: DispoBounds,
) -> torch.Tensor:
    """DISPO's per-token loss (Karaman et al. 2026, "DISPO: Enhancing Training Efficiency and
    Stability in Reinforcement Learning for Large Language Model Mathematical Reasoning",
    arXiv 2602.00983, AISTATS 2026: the objective J_DISPO of its method section; its section and
    equation numbers were not checked: only the abstract and a summary of J_DISPO were readable).

    DISPO is REINFORCE-style, like CISPO: the importance weight is a stop-gradient coefficient on
    ``log pi``. It maximizes ``(1 / sum_i |o_i|) sum_i sum_t sg(r^d_{i,t}) A_{i,t} log pi_theta``
    (DAPO's token-level aggregation), with the decoupled weight

        r^d = r * 1[1 - low_pos <= r <= 1 + high_pos]   for correct responses (A > 0)
        r^d = r * 1[1 - low_neg <= r <= 1 + high_neg]   for incorrect responses (A < 0)

    so a token's gradient is ``r A grad log pi`` inside its side's interval and exactly zero
    outside it: the abstract's fix to CISPO, whose clipped weight still pushes every token
    outside the trust region ("permitting non-zero gradients outside the trust-region"). The
    four bounds make the four regimes (correct/incorrect x weight above/below 1) separately
    tunable. (Zero outside rather than clamped at the bound is our reading of the abstract; see
    docs/comparison_rows.md.)

    Returns ``-sg(r^d) A log pi`` per token (minimize form), the shape of ``per_token_logps``
    broadcast with ``advantages`` (pass (B, 1) advantages for (B, T) log-probs). The caller
    masks padding and aggregates (DAPO: a sum over completion tokens divided by their count).
    """
    ratio = torch.exp(per_token_logps.detach() - old_per_token_logps.detach())
    below, above = dispo_outside(ratio, advantages, bounds)
    weight = torch.where(below | above, torch.zeros_like(ratio), ratio)
    return -weight * advantages * per_token_logps
