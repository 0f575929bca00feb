"""The seam for named terms: a comparison row that is GRPO† plus one named part (GRPO-CARE's bonus, RLKD's
structure reward, SDPO's self-teacher, ReLIFT's teacher targets, ...).

A :class:`Term` is registered under the config field that selects it (``selector``) and its value there
(``name``); it declares what it asks of the run (:class:`zppo_trl.needs.Needs`) and says what it does in the dry
run and the model card (:meth:`Term.describe`). :func:`terms_for` gives a configuration's terms in registry order;
nothing outside :mod:`zppo_trl.terms` tests a term's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..needs import Needs

__all__ = ["TERMS", "Description", "Term", "register_term", "selected_by", "terms_for"]


@dataclass(frozen=True)
class Description:
    """What a part says about itself: the dry run's plan lines, the model card's sentence on how the row trains,
    and what it has the teacher do (for the card's and the dry run's teacher line; empty: nothing)."""

    plan: tuple[str, ...] = ()
    card: str = ""
    teacher_use: tuple[str, ...] = field(default_factory=tuple)


class Term:
    """A named term added to GRPO† (the paper's comparison rows of that shape).

    Class attributes:
        selector: the config field that selects it (``"reward_term"``, ``"policy_objective"``,
            ``"zero_variance_signal"``).
        name: its value there.
        printed: how the paper's tables print the row (``"GRPO-CARE"``; the row is ``GRPO-CARE†``).
        needs: what it asks of the run.
    """

    selector: ClassVar[str]
    name: ClassVar[str]
    printed: ClassVar[str]
    needs: ClassVar[Needs] = Needs()

    @classmethod
    def describe(cls, args: Any) -> Description:
        """Its dry-run lines and card sentence for the configuration ``args``."""
        return Description()


# Every registered term, in registration order (the order their run-time parts apply in).
TERMS: dict[tuple[str, str], type[Term]] = {}


def register_term(cls: type[Term]) -> type[Term]:
    """Register a :class:`Term` subclass under ``(cls.selector, cls.name)`` (a class decorator)."""
    key = (cls.selector, cls.name)
    if key in TERMS:
        raise ValueError(f"a term {cls.selector}={cls.name!r} is already registered ({TERMS[key].__name__})")
    TERMS[key] = cls
    return cls


def selected_by(selector: str) -> dict[str, type[Term]]:
    """The terms one config field selects: its value -> the term."""
    return {name: cls for (field_name, name), cls in TERMS.items() if field_name == selector}


def terms_for(args: Any) -> tuple[type[Term], ...]:
    """The terms configuration ``args`` selects, in registry order."""
    return tuple(cls for (selector, name), cls in TERMS.items() if getattr(args, selector, None) == name)
