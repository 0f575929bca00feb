"""A configuration's row, resolved once: its parts and the union of what they ask of the run.

A row is a step-5 part (:class:`zppo_trl.augmentations.Source`: an augmentation, none for GRPO\u2020, or a target
source: an SFT control or a distillation mode); a step-6 objective from the loss registry (the target source's loss,
or the policy objective); and zero or more named terms (:mod:`zppo_trl.terms`). Each part declares its
:class:`~zppo_trl.needs.Needs`; :func:`resolve_row` unions them. The trainer, the config's checks, the dry run and
its memory plan, the model card and the launcher's server list ask the :class:`Row` ("does this row use the
teacher?", "which models sit next to the student?") and never test a row's name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .augmentations import AUGMENTATIONS, NoAugmentation, Source
from .description import Description
from .distill import DISTILLATIONS
from .losses import PAPER_POLICY_OBJECTIVE, Loss
from .needs import Needs
from .objectives import loss_for, policy_objectives
from .reformulate import KINDS
from .terms import Term, terms_for

__all__ = [
    "MATCHED_REPLAY_FRACTION",
    "PAPER_GROUP_SIZE",
    "PAPER_REPLAY_FRACTION",
    "Row",
    "resolve_row",
    "row_source",
    "row_name",
]


@dataclass(frozen=True)
class Row:
    """A configuration's parts and their needs (see :func:`resolve_row`).

    Attributes:
        source: its step-5 part's class (:class:`~zppo_trl.augmentations.NoAugmentation` for GRPO\u2020).
        objective: the registered loss step 6 trains with.
        terms: the run-time terms: the objective's own (the self-teachers'), then the named terms in registry order.
        needs: the union of every part's needs.
        loads_teacher: the teacher's scores come from ``distill_teacher`` loaded next to the student on every rank,
            not from its server.
    """

    source: type[Source]
    objective: Loss
    terms: tuple[type[Term], ...]
    needs: Needs
    loads_teacher: bool

    @property
    def teacher_scores_from_server(self) -> frozenset[str]:
        """What the teacher server scores on the trained rows (empty where a loaded teacher does)."""
        return self.scores_from_server(self.loads_teacher)

    @property
    def uses_teacher_server(self) -> bool:
        """Whether the run talks to the teacher server (``teacher_base_url``): samples, requests or scores."""
        return self.needs_teacher_server(self.loads_teacher)

    def scores_from_server(self, loaded: bool) -> frozenset[str]:
        """What the teacher server scores on the trained rows when a teacher is (``loaded``) or is not loaded next
        to the student (the trainer may be handed one that ``distill_teacher`` does not name)."""
        return frozenset() if loaded else self.needs.teacher_scores

    def needs_teacher_server(self, loaded: bool) -> bool:
        """Whether the run talks to the teacher server, a teacher being ``loaded`` next to the student or not."""
        return self.needs.teacher_samples or self.needs.teacher_requests or bool(self.scores_from_server(loaded))

    @property
    def uses_teacher(self) -> bool:
        """Whether a teacher takes part at all: behind its server or loaded next to the student."""
        return self.uses_teacher_server or self.loads_teacher

    def describe(self, args: Any) -> tuple[Description, ...]:
        """What every part says in the dry run and the model card: its source's, then its terms' in order."""
        return (self.source.describe(args), *(term.describe(args) for term in self.terms))


def resolve_row(args: Any) -> Row:
    """The row of configuration ``args`` (a :class:`~zppo_trl.ZPPOConfig` or anything with its fields): its parts
    from the fields that select them, and the union of their needs."""
    source = row_source(args)
    objective = loss_for(args, source.loss)
    terms = ((objective.term,) if objective.term is not None else ()) + terms_for(args)
    needs = objective.needs | source.needs
    for term in terms:
        needs = needs | term.needs
    loads_teacher = bool(getattr(args, "distill_teacher", None)) and bool(needs.teacher_scores)
    return Row(source, objective, terms, needs, loads_teacher)


def row_source(args: Any) -> type[Source]:
    """The step-5 part configuration ``args`` selects: its ``distillation`` mode's, its ``augmentations``' family, or
    :class:`~zppo_trl.augmentations.NoAugmentation` (GRPO\u2020)."""
    distillation = getattr(args, "distillation", None)
    if distillation:
        return DISTILLATIONS[distillation]
    kinds = list(getattr(args, "augmentations", None) or [])
    return AUGMENTATIONS[kinds[0]] if kinds else NoAugmentation


# ---------------------------------------------------------------------- the row's name

# The paper's defaults that the appendix's controls vary, and that a row's name states when it differs from them:
# G_S and the corpus passes (the group-size and corpus-pass controls), rho_replay (the replay control).
PAPER_GROUP_SIZE = 8
PAPER_REPLAY_FRACTION = 0.25
# "Replay-matched": GRPO†'s replay raised until its per-step cap (|X_new| new + rho_replay |X_new| replayed groups)
# equals the headline ZPPO's (|X_new| new + 0.25 |X_new| replayed + at most rho_aug = 0.25 |X_new| reformulated).
MATCHED_REPLAY_FRACTION = PAPER_REPLAY_FRACTION + 0.25
_DAGGER = "\u2020"


def row_name(args: Any) -> str:
    """The paper's name of configuration ``args``'s row (see :attr:`zppo_trl.ZPPOConfig.variant`)."""
    name, qualifiers = _base_name(args)
    if _replay_matched(args):
        name = f"Replay-matched {name}"
    qualifiers += _control_qualifiers(args)
    if not qualifiers:
        return name
    if name.endswith(")"):  # one pair of brackets: "ZPPO (GSPO, G_S=16, 1 pass)"
        return f"{name[:-1]}, {', '.join(qualifiers)})"
    return f"{name} ({', '.join(qualifiers)})"


def _grpo() -> str:
    """The base method's name, "GRPO": how the paper prints its objective (the rows are GRPO plus their parts)."""
    return policy_objectives()[PAPER_POLICY_OBJECTIVE].printed


def _renamed(name: str, printed: str) -> str | None:
    """GRPO† (or GRPO) with a part named after its method: ``"GRPO-CARE†"``; None for any other row."""
    return {f"{_grpo()}{_DAGGER}": f"{printed}{_DAGGER}", _grpo(): printed}.get(name)


def _base_name(args: Any) -> tuple[str, list[str]]:
    """The row's name from its augmentations, buffer, distillation, objective and terms, and the qualifiers the
    terms add where they do not rename the row."""
    kinds = set(args.augmentations)
    dagger = _DAGGER if args.replay_fraction > 0 else ""
    source = row_source(args)
    if source.printed:  # a row of its own (the SFT controls, the distillation modes), not GRPO plus a branch
        name = source.printed + dagger
    elif kinds == set(KINDS):
        name = "ZPPO" if dagger else f"{_grpo()}+Both"
    elif not kinds:
        name = f"{_grpo()}{dagger}"
    else:
        kind = next(iter(kinds))
        kind = kind.upper() if kind in KINDS else kind.capitalize()
        name = f"{_grpo()}{dagger}+{kind}"
    if args.policy_objective != PAPER_POLICY_OBJECTIVE:
        objective = policy_objectives()[args.policy_objective].printed
        name = _renamed(name, objective) or f"{name} ({objective})"
    qualifiers = []
    # the named terms rename GRPO† ("GRPO-CARE†") or are a suffix, or, for a qualifying term, a qualifier
    # ("ZPPO (LENS)"); suffixes before qualifiers (an objective's own term is named as the objective, above)
    for term in sorted(terms_for(args), key=lambda t: t.qualifies):
        renamed = _renamed(name, term.printed)
        if renamed is not None:
            name = renamed
        elif term.qualifies:
            qualifiers.append(term.printed)
        else:
            name = f"{name} ({term.printed})"
    return name, qualifiers


def _replay_matched(args: Any) -> bool:
    """GRPO† with its replay raised until its per-step cap is the headline ZPPO's (the replay control)."""
    plain = row_source(args) is NoAugmentation and not terms_for(args)
    return plain and math.isclose(args.replay_fraction, MATCHED_REPLAY_FRACTION)


def _control_qualifiers(args: Any) -> list[str]:
    """What the appendix's controls vary, where it is not the paper's default: the replay fraction (GRPO† and ZPPO),
    the BCQ candidate content, G_S with the corpus passes, and a backbone outside Qwen3.5."""
    kinds = set(args.augmentations)
    qualifiers = []
    replay_row = args.replay_fraction > 0 and not row_source(args).supervised and kinds in (set(), set(KINDS))
    if replay_row and not _replay_matched(args) and not math.isclose(args.replay_fraction, PAPER_REPLAY_FRACTION):
        qualifiers.append(f"\u03c1_replay={args.replay_fraction:.2f}")
    qualifiers += row_source(args).qualifiers(args)  # what its step-5 part's settings vary (BCQ's candidate content)
    if args.num_generations > PAPER_GROUP_SIZE or args.corpus_passes != 1:
        passes = args.corpus_passes
        qualifiers.append(f"G_S={args.num_generations}, {passes} pass{'' if passes == 1 else 'es'}")
    if args.student_family:
        qualifiers.append(args.student_family)
    return qualifiers
