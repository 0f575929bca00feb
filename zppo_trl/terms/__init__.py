"""Named terms: the comparison rows that are GRPO\u2020 plus one named part, behind one seam (:mod:`.base`).

One module per term family, each holding its terms' arithmetic, settings, checks, dry-run and card text, run-time
glue, metrics and checkpoint state; each registers its terms with :func:`register_term`. A new term is one module
and its name in :data:`TERM_MODULES` (the order is the order the terms' run-time parts apply in).
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import (
    TERMS,
    Contribution,
    Description,
    PlainStep,
    Term,
    TermContext,
    TermSelectors,
    register_term,
    selected_by,
    settings_fields,
    terms_for,
)

__all__ = [
    "SETTINGS",
    "TERMS",
    "TERM_SELECTORS",
    "TERM_MODULES",
    "Contribution",
    "Description",
    "PlainStep",
    "Term",
    "TermContext",
    "TermSelectors",
    "check_term_selectors",
    "register_term",
    "selected_by",
    "settings_fields",
    "terms_for",
    "validate_term",
]

TERM_MODULES = ("zero_variance", "self_teachers", "grpo_care", "perception_r1", "rlkd")

for _module in TERM_MODULES:
    importlib.import_module(f"{__name__}.{_module}")

# The config fields that select a term besides policy_objective (the objective registry's).
TERM_SELECTORS: tuple[str, ...] = tuple(TermSelectors.__dataclass_fields__)
# The config fields of every term, as dataclasses mixed into ZPPOConfig: the selectors, then each family's settings.
SETTINGS: tuple[type, ...] = (TermSelectors, *dict.fromkeys(t.settings for t in TERMS.values() if t.settings))


def check_term_selectors(args: Any) -> None:
    """Every term's settings (whatever the row: a set field must be valid) and the selectors' values."""
    for term in TERMS.values():
        term.check_settings(args)
    for selector in TERM_SELECTORS:
        names = ["none", *selected_by(selector)]
        if getattr(args, selector) not in names:
            raise ValueError(f"{selector} must be one of {names}, got {getattr(args, selector)!r}")


def validate_term(term: type[Term], args: Any) -> None:
    """Refuse a configuration selected ``term`` cannot train: a term on GRPO\u2020's pipeline refuses augmentations
    and distillation (its ``Needs.plain_pipeline_only``), one that gives each token its own advantage a
    sequence-level objective; then the term's own :meth:`Term.validate`."""
    if term.needs.plain_pipeline_only and (args.augmentations or args.distillation is not None):
        raise ValueError(
            f"{term.selector}={term.name!r} is a row on GRPO\u2020's pipeline: set augmentations: [] and no "
            f"distillation (got augmentations={args.augmentations}, distillation={args.distillation!r})"
        )
    if term.needs.token_level_objective and args.row.objective.sequence_level:
        raise ValueError(
            f"{term.selector}={term.name!r} gives each token its own advantage; policy_objective="
            f"{args.policy_objective!r} trains one ratio per response: use a token-level objective"
        )
    term.validate(args)
