"""Named terms: the comparison rows that are GRPO† plus one named part, behind one seam (:mod:`.base`).

One module per term family; each registers its terms with :func:`register_term`. A new term is one module and
its name in :data:`TERM_MODULES` (the order is the order the terms' run-time parts apply in).
"""

from __future__ import annotations

import importlib

from .base import TERMS, Description, Term, register_term, selected_by, terms_for

__all__ = ["TERMS", "TERM_MODULES", "Description", "Term", "register_term", "selected_by", "terms_for"]

TERM_MODULES = ("zero_variance", "self_teachers", "grpo_care", "perception_r1", "rlkd")

for _module in TERM_MODULES:
    importlib.import_module(f"{__name__}.{_module}")
