"""A configuration's row, resolved once: its parts and the union of what they ask of the run.

A row is a step-5 augmentation (or none), or steps 4-6 replaced by distillation; a step-6 objective from the loss
registry; and zero or more named terms (:mod:`zppo_trl.terms`). Each part declares its
:class:`~zppo_trl.needs.Needs`; :func:`resolve_row` unions them. The trainer, the config's checks, the dry run and
its memory plan, the model card and the launcher's server list ask the :class:`Row` ("does this row use the
teacher?", "which models sit next to the student?") and never test a row's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .augmentations import AUGMENTATIONS, Augmentation
from .distill import DISTILLATION_NEEDS
from .losses import Loss, loss_for
from .needs import Needs
from .terms import Description, Term, terms_for

__all__ = ["Row", "resolve_row"]


@dataclass(frozen=True)
class Row:
    """A configuration's parts and their needs (see :func:`resolve_row`).

    Attributes:
        augmentation: the step-5 augmentation's class (None: no augmentation).
        distillation: ``"off"``/``"on"`` where steps 4-6 are distillation, else None.
        objective: the registered loss step 6 trains with.
        terms: the named terms, in registry order.
        needs: the union of every part's needs.
        loads_teacher: the teacher's scores come from ``distill_teacher`` loaded next to the student on every rank,
            not from its server.
    """

    augmentation: type[Augmentation] | None
    distillation: str | None
    objective: Loss
    terms: tuple[type[Term], ...]
    needs: Needs
    loads_teacher: bool

    @property
    def teacher_scores_from_server(self) -> frozenset[str]:
        """What the teacher server scores on the trained rows (empty where a loaded teacher does)."""
        return frozenset() if self.loads_teacher else self.needs.teacher_scores

    @property
    def uses_teacher_server(self) -> bool:
        """Whether the run talks to the teacher server (``teacher_base_url``): samples, requests or scores."""
        return self.needs.teacher_samples or self.needs.teacher_requests or bool(self.teacher_scores_from_server)

    @property
    def uses_teacher(self) -> bool:
        """Whether a teacher takes part at all: behind its server or loaded next to the student."""
        return self.uses_teacher_server or self.loads_teacher

    def describe(self, args: Any) -> tuple[Description, ...]:
        """Every term's dry-run lines and card sentence, in registry order."""
        return tuple(term.describe(args) for term in self.terms)


def resolve_row(args: Any) -> Row:
    """The row of configuration ``args`` (a :class:`~zppo_trl.ZPPOConfig` or anything with its fields): its parts
    from the fields that select them, and the union of their needs."""
    kinds = list(getattr(args, "augmentations", None) or [])
    augmentation = AUGMENTATIONS[kinds[0]] if kinds else None
    distillation = getattr(args, "distillation", None) or None
    objective = loss_for(args, supervised=augmentation is not None and augmentation.supervised)
    terms = terms_for(args)
    needs = objective.needs
    if augmentation is not None:
        needs = needs | augmentation.needs
    if distillation is not None:
        needs = needs | DISTILLATION_NEEDS[distillation]
    for term in terms:
        needs = needs | term.needs
    loads_teacher = bool(getattr(args, "distill_teacher", None)) and bool(needs.teacher_scores)
    return Row(augmentation, distillation, objective, terms, needs, loads_teacher)
