"""Every row family's parts behind one contract, and the questions the configuration asks of all of them at once.

A row is made of parts of four families, each a registry of named parts:

============  ==========================================  =====================================================
family        registry (selected by)                      a part is
============  ==========================================  =====================================================
augmentation  ``AUGMENTATIONS`` (``augmentations``)        an :class:`~zppo_trl.augmentations.Augmentation` class
targets       ``AUGMENTATIONS`` (``augmentations``: the    a :class:`~zppo_trl.augmentations.TargetSource` class
              SFT controls), ``DISTILLATIONS``
              (``distillation``)
objective     ``LOSSES`` (``policy_objective``; the        a registered :class:`~zppo_trl.losses.Loss`, with
              target sources name theirs)                  the run-time term it trains with, if any (SDPO's)
term          ``TERMS`` (``reward_term``,                  a :class:`~zppo_trl.terms.Term` class
              ``zero_variance_signal``)
============  ==========================================  =====================================================

Each part declares what it asks of the run (``needs``, :class:`~zppo_trl.needs.Needs`) and the settings it reads
(``reads``); each family checks its parts' settings whatever the row, and refuses what a selected part cannot train.
:func:`registered_parts` lists them as :class:`Part` entries, one per name that selects one; the configuration asks
them for its checks (:func:`check_parts`) and its unused-setting warning (:func:`unused_settings`), and the guard test
for the names they own. A new part is one module and one registry line; nothing here names one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .augmentations import AUGMENTATIONS, check_augmentations
from .distill import DISTILLATIONS, check_distillation
from .needs import SCORES_TOP_K, Needs
from .objective_settings import check_objective_settings, validate_objective
from .objectives import objective_terms, policy_objectives
from .terms import TERMS, check_term_selectors, settings_fields, validate_term

__all__ = ["Part", "check_parts", "registered_parts", "unused_settings"]


@dataclass(frozen=True)
class Part:
    """One registered part, as every family declares it.

    Attributes:
        family: ``"augmentation"``, ``"targets"``, ``"objective"`` or ``"term"``.
        selector: the configuration field whose value selects it.
        name: that value (an augmentation's kind, a distillation mode, an objective, a term's name).
        printed: how the paper's tables print it (None: the row is named from its kinds).
        needs: what it asks of the run.
        reads: the settings it reads besides its selector.
        check: its family's check of its settings' values, run whatever the row (a set field must be valid).
        validate: its check of a configuration that selects it (the combinations it cannot train).
    """

    family: str
    selector: str
    name: str
    printed: str | None
    needs: Needs
    reads: tuple[str, ...]
    check: Callable[[Any], None]
    validate: Callable[[Any], None]

    def selected(self, args: Any) -> bool:
        """Whether configuration ``args`` selects it."""
        value = getattr(args, self.selector, None)
        return self.name in value if isinstance(value, list) else value == self.name


def registered_parts() -> tuple[Part, ...]:
    """Every registered part of every family, one entry per name that selects one, in registry order."""
    parts = [
        Part(cls.family, "augmentations", kind, cls.printed, cls.needs, _reads(cls, kind), check_augmentations,
             cls.validate)
        for kind, cls in AUGMENTATIONS.items()
    ]  # fmt: skip
    parts += [
        Part(cls.family, "distillation", mode, cls.printed, cls.needs, _reads(cls, mode), check_distillation,
             cls.validate)
        for mode, cls in DISTILLATIONS.items()
    ]  # fmt: skip
    parts += [
        Part("objective", "policy_objective", objective, loss.printed, loss.needs, loss.reads,
             check_objective_settings, validate_objective)
        for objective, loss in policy_objectives().items()
    ]  # fmt: skip
    parts += [
        Part("term", term.selector, term.name, term.printed, term.needs, term.reads, check_term_selectors,
             lambda args, term=term: validate_term(term, args))
        for term in TERMS.values()
    ]  # fmt: skip
    return tuple(parts)


def _reads(cls: Any, name: str) -> tuple[str, ...]:
    """The settings a step-5 part's class reads where ``name`` selects it (its ``reads``: setting -> the names)."""
    return tuple(setting for setting, names in cls.reads.items() if name in names)


def check_parts(args: Any) -> None:
    """Every family's checks of its settings (whatever the row), then the checks of the parts ``args`` selects; each
    raises ValueError naming the field."""
    parts = registered_parts()
    for check in dict.fromkeys(part.check for part in parts):
        check(args)
    for part in parts:
        if part.selected(args):
            part.validate(args)


def unused_settings(args: Any) -> list[tuple[str, str]]:
    """The row-specific settings ``args`` sets away from their defaults on a row that never reads them (a likely
    mistake, e.g. ``prefix_fraction`` without ``augmentations: [prefix]``), each with what would read it.

    A part's settings are read where it is selected (its ``reads``); every field of a term's settings dataclass is
    row-specific. Two settings are read by what the row's needs ask of the teacher, and one also by a teacher loaded
    next to the student."""
    row, parts = args.row, registered_parts()
    readers: dict[str, list[Part]] = {}
    for part in parts:
        for name in part.reads:
            readers.setdefault(name, []).append(part)
    for term in (*TERMS.values(), *objective_terms().values()):
        for name in settings_fields(term):
            readers.setdefault(name, [])
    found = {
        "distill_teacher": (bool(row.needs.teacher_scores), "a row the teacher scores (its needs)"),
        "distill_top_k": (SCORES_TOP_K in row.teacher_scores_from_server, "top-k scores from the teacher server"),
    }
    for name, by in readers.items():
        said = _said(by)
        used = any(part.selected(args) for part in by)
        if name == "distill_chunk_size":  # a teacher loaded next to the student is scored in chunks too
            used, said = used or row.loads_teacher, f"{said} or a teacher loaded next to the student"
        found.setdefault(name, (used, said))
    defaults = {f.name: f.default for f in dataclasses.fields(args)}
    return [(name, said) for name, (used, said) in found.items() if not used and getattr(args, name) != defaults[name]]


def _said(parts: list[Part]) -> str:
    """Who reads a setting, in the words of their selectors: ``policy_objective: kdrl``, ``augmentations with bcq``,
    ``reward_term: grpo_care|rlkd``."""
    said: dict[str, list[str]] = {}
    for part in parts:
        said.setdefault(part.selector, []).append(part.name)
    return " or ".join(
        f"augmentations with {' or '.join(names)}" if selector == "augmentations" else f"{selector}: {'|'.join(names)}"
        for selector, names in said.items()
    )
