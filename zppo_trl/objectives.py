"""Every registered loss, and which one a configuration trains with.

The losses are registered by the modules that define them (:func:`zppo_trl.losses.register_loss`): the built-ins in
:mod:`zppo_trl.losses`, and each module of :data:`OBJECTIVE_MODULES`. This module imports them all, so that
:func:`policy_objectives` and :func:`loss_for` answer with the whole registry; :mod:`zppo_trl.losses` imports none of
them, so no module that registers a loss is imported by the one it registers into.
"""

from __future__ import annotations

import importlib
from typing import Any

from .losses import LOSSES, Loss

__all__ = ["OBJECTIVE_MODULES", "OBJECTIVE_TERM_SETTINGS", "loss_for", "objective_terms", "policy_objectives"]

# Modules that register further objectives: a new objective is one module with a
# ``@register_loss(..., objective=...)`` function, and one line here.
OBJECTIVE_MODULES: tuple[str, ...] = ("zppo_trl.hybrid_objectives", "zppo_trl.terms.self_teachers", "zppo_trl.distill")

for _module in OBJECTIVE_MODULES:
    importlib.import_module(_module)


def policy_objectives() -> dict[str, Loss]:
    """Every registered policy objective: its ``policy_objective`` value -> its loss, in registration order."""
    return {loss.objective: loss for loss in LOSSES.values() if loss.objective is not None}


def objective_terms() -> dict[str, type]:
    """The objectives that train with a run-time term of their own (the self-teachers): objective -> its term."""
    return {objective: loss.term for objective, loss in policy_objectives().items() if loss.term is not None}


# The config fields of the objectives' own terms, as dataclasses mixed into ZPPOConfig.
OBJECTIVE_TERM_SETTINGS: tuple[type, ...] = tuple(
    dict.fromkeys(term.settings for term in objective_terms().values() if term.settings is not None)
)


def loss_for(args: Any, loss: str | None = None) -> Loss:
    """The loss a configuration trains with: the registered ``loss`` its step-5 part names where it fits targets
    (``sft`` for the SFT controls, ``jsd`` for the distillation rows: :attr:`zppo_trl.augmentations.Source.loss`),
    else its ``policy_objective``'s."""
    if loss is not None:
        return LOSSES[loss]
    objectives = policy_objectives()
    if args.policy_objective not in objectives:
        raise ValueError(f"policy_objective must be one of {list(objectives)}, got {args.policy_objective!r}")
    return objectives[args.policy_objective]
