"""What a part of a row says about itself: one :class:`Description` per part, for the dry run and the model card.

Every row family answers :meth:`describe(args)` with one (the step-5 sources, :class:`zppo_trl.augmentations.Source`;
the named terms and an objective's own term, :class:`zppo_trl.terms.Term`); :meth:`zppo_trl.row.Row.describe` lists
the row's, its source's first. The dry run (:mod:`zppo_trl.plan`) and the model card (:mod:`zppo_trl.model_card`)
compose their lines from these and from the row's needs, never from a part's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Description", "served_teacher"]


@dataclass(frozen=True)
class Description:
    """What one part says about itself.

    Attributes:
        plan: the dry run's lines for it (each indented two spaces).
        card: its sentence in the model card's account of how the row trains (a source's opens it; a term's follows
            the objective).
        teacher_use: what it has the teacher do, in the dry run's short words (the teacher line of the dry run, and
            of the card where no part says the card's line whole).
        teacher: the model card's whole Teacher line, where the part says it (a source that has the teacher do
            its own work); empty: the card composes it from the row's needs and the parts' ``teacher_use``.
    """

    plan: tuple[str, ...] = ()
    card: str = ""
    teacher_use: tuple[str, ...] = ()
    teacher: str = ""


def served_teacher(args: Any) -> str:
    """The model card's words for the teacher behind its server (``args``: the configuration)."""
    return f"`{args.teacher_model}`, a frozen teacher served behind an OpenAI-compatible endpoint"
