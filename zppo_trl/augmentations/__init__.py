"""Step 5 of Algorithm 1: the parts that turn the teacher's evidence on hard questions into
extra groups (or, for the supervised controls, into targets), behind one seam.

- `base`: the seam (`Source`, with its two families `Augmentation` and `TargetSource`; `NoAugmentation`, GRPO\u2020's;
  `Evidence`, `BuiltGroup`, `BuiltGroups`, `teacher_results`).
- `candidates`: ZPPO's BCQ and NCQ prompts (`CandidateReformulation`); `candidate_content`: what a BCQ
  candidate block shows (the paper's candidate-content controls, `CANDIDATE_CONTENTS`).
- `guidance`: the paper's Hint and Prefix controls (`TeacherHint`, `ResponsePrefix`).
- `targets`: the supervised Correction-SFT and Error-reflection-SFT controls (`CorrectionTargets`,
  `ReflectionTargets`).

`AUGMENTATIONS` maps each kind name a configuration's ``augmentations`` may hold to the class that
builds it; `make_augmentation` builds from it. Kinds that map to the same class combine (BCQ and
NCQ, ZPPO and its ablations); every other kind is a comparison row of its own, used alone. A new
augmentation is one new module and one line in `AUGMENTATIONS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import (
    Augmentation,
    AugmentationInputs,
    BuiltGroup,
    BuiltGroups,
    Evidence,
    NoAugmentation,
    Source,
    TargetSource,
    teacher_results,
)
from .candidate_content import CANDIDATE_CONTENTS, CandidateContent, candidate_content
from .candidates import CandidateReformulation
from .guidance import Guidance, HintedGuidance, ResponsePrefix, TeacherHint, answer_free, leaks_answer
from .targets import CorrectionTargets, ReflectionTargets, SupervisedInstance

__all__ = [
    "AUGMENTATIONS",
    "AUGMENTATION_KINDS",
    "Augmentation",
    "AugmentationInputs",
    "BuiltGroup",
    "BuiltGroups",
    "CANDIDATE_CONTENTS",
    "CandidateContent",
    "CandidateReformulation",
    "CorrectionTargets",
    "Evidence",
    "Guidance",
    "HintedGuidance",
    "NoAugmentation",
    "ReflectionTargets",
    "ResponsePrefix",
    "Source",
    "SupervisedInstance",
    "TargetSource",
    "TeacherHint",
    "answer_free",
    "candidate_content",
    "check_augmentations",
    "check_kinds",
    "leaks_answer",
    "make_augmentation",
    "parse_kinds",
    "teacher_results",
]

# Every kind of extra group or target -> the augmentation that builds it (the registry).
AUGMENTATIONS: dict[str, type[Augmentation]] = {
    "bcq": CandidateReformulation,
    "ncq": CandidateReformulation,
    "hint": TeacherHint,
    "prefix": ResponsePrefix,
    "correction": CorrectionTargets,
    "reflection": ReflectionTargets,
}
AUGMENTATION_KINDS = tuple(AUGMENTATIONS)


def _families() -> str:
    """The combinations a run may use, in words: "a subset of [bcq, ncq], or [hint], ... alone"."""
    families: dict[type[Augmentation], list[str]] = {}
    for kind, cls in AUGMENTATIONS.items():
        families.setdefault(cls, []).append(kind)
    shared = [f"a subset of [{', '.join(kinds)}]" for kinds in families.values() if len(kinds) > 1]
    alone = [f"[{kinds[0]}]" for kinds in families.values() if len(kinds) == 1]
    return ", or ".join(shared + [", ".join(alone[:-1]) + f" or {alone[-1]} alone"])


def parse_kinds(value) -> list[str]:
    """A kind list as the command line or a YAML gives it ("bcq,ncq", ["bcq", "ncq"], or [""] for none):
    flattened, stripped, empties dropped."""
    parts = [value] if isinstance(value, str) else list(value or [])
    return [k.strip() for part in parts for k in str(part).split(",") if k.strip()]


def check_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
    """``kinds`` validated: registered kinds, no repeats, all of one family (a subset of ``("bcq", "ncq")``,
    or one of ``"hint"``, ``"prefix"``, ``"correction"``, ``"reflection"`` alone)."""
    kinds = tuple(kinds)
    unknown = [k for k in kinds if k not in AUGMENTATIONS]
    if unknown or len(set(kinds)) != len(kinds):
        raise ValueError(f"augmentations must be distinct kinds from {list(AUGMENTATION_KINDS)}, got {list(kinds)}")
    if len({AUGMENTATIONS[k] for k in kinds}) > 1:
        raise ValueError(
            f"augmentations {list(kinds)} mix kinds that do not combine: use {_families()} "
            "(each of those is a comparison row of its own)"
        )
    return kinds


def check_augmentations(args: Any) -> None:
    """The configuration's ``augmentations`` (registered kinds of one family) and every augmentation's settings,
    whatever the row (a set field must be valid); raises ValueError naming the field."""
    check_kinds(args.augmentations)
    for cls in dict.fromkeys(AUGMENTATIONS.values()):
        cls.check_settings(args)


def make_augmentation(
    kinds: Sequence[str],
    *,
    prefix_fraction: float = 0.4,
    tokenizer: Any = None,
    question_of: Any = None,
    teacher_chat: Any = None,
    grade: Any = None,
    answer_of: Any = None,
    bcq_candidate_content: str = "full",
) -> Augmentation | None:
    """The step-5 augmentation of a configuration's ``augmentations`` (None for none: GRPO†/GRPO),
    built by the registered class of its kinds (`AUGMENTATIONS`).

    The supervised controls need the trainer's ``question_of(key)``, ``teacher_chat(key, text)``
    and ``grade(keys, responses_per_key)`` (see :mod:`zppo_trl.augmentations.targets`); Prefix the student's
    tokenizer; Hint ``answer_of(key)``, the gold answer its leak count looks for; BCQ
    ``bcq_candidate_content``, what its candidate blocks show.
    """
    kinds = check_kinds(kinds)
    if not kinds:
        return None
    inputs = AugmentationInputs(
        prefix_fraction, tokenizer, question_of, teacher_chat, grade, answer_of, bcq_candidate_content
    )
    return AUGMENTATIONS[kinds[0]].create(kinds, inputs)
