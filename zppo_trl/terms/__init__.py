"""Named terms: the comparison rows that are GRPO\u2020 plus one named part, behind one seam (:mod:`.base`).

One module per term family, each holding its terms' arithmetic, settings, checks, dry-run and card text, run-time
glue, metrics and checkpoint state; each registers its terms with :func:`register_term`. A new term is one module
and its name in :data:`TERM_MODULES` (the order is the order the terms' run-time parts apply in).
"""

from __future__ import annotations

import importlib

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
    "register_term",
    "selected_by",
    "settings_fields",
    "terms_for",
]

TERM_MODULES = ("zero_variance", "self_teachers", "grpo_care", "perception_r1", "rlkd")

for _module in TERM_MODULES:
    importlib.import_module(f"{__name__}.{_module}")

# The config fields that select a term besides policy_objective (the objective registry's).
TERM_SELECTORS: tuple[str, ...] = tuple(TermSelectors.__dataclass_fields__)
# The config fields of every term, as dataclasses mixed into ZPPOConfig: the selectors, then each family's settings.
SETTINGS: tuple[type, ...] = (TermSelectors, *dict.fromkeys(t.settings for t in TERMS.values() if t.settings))
