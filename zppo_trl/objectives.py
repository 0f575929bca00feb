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

The losses and their math are registered in :mod:`zppo_trl.losses`; this module names the objectives
for the configuration (``zppo_trl.config`` maps each onto TRL's fields). Pure: no TRL, no trainer.
"""

from __future__ import annotations

from .losses import DispoBounds, cispo_weight_bound, dispo_outside, dispo_per_token_loss, policy_objectives

__all__ = [
    "DUAL_CLIP_OBJECTIVES",
    "OBJECTIVES",
    "OBJECTIVE_NAMES",
    "DispoBounds",
    "cispo_weight_bound",
    "dispo_outside",
    "dispo_per_token_loss",
]

# The values of policy_objective (the paper's four first, then any registered later) and how the paper
# prints each one; read once at import, after zppo_trl.losses.OBJECTIVE_MODULES have registered theirs.
OBJECTIVES = tuple(policy_objectives())
OBJECTIVE_NAMES = {objective: loss.printed for objective, loss in policy_objectives().items()}
# The objectives whose loss is the clipped surrogate, so the dual clip c_dual (TRL's delta) acts in them.
DUAL_CLIP_OBJECTIVES = ("grpo", "gspo")
