"""Hard-question ranking, the pre-cap, BCQ/NCQ instance planning and the post-cap.

Algorithm 1, Steps 2, 4 and 5:

- Pre-cap (:func:`select_hard`): questions with plain accuracy ``r_x < tau``, ascending
  ``r_x`` (hardest first, ties in random order), at most ``rho_aug * |X_new|`` of them.
- Planning (:func:`plan_reformulations`): BCQ needs a correct teacher rollout and a wrong
  student rollout whose ``\\boxed{}`` parses (one of each drawn uniformly, order
  shuffled); NCQ needs at least one parsed wrong rollout (all of them become
  candidates, their distinct answers are listed). Post-cap: walk the ranked questions,
  append each one's BCQ instance then its NCQ instance, and stop when the next one
  would exceed ``rho_aug * |X_new|``, so a question with both keeps BCQ when one slot is
  left.

Planning needs no compressed text: candidates are the raw rollouts, to be compressed
only for the instances that survive the cap. This module is pure: no TRL, no trainer.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from .prompts import distinct_answers
from .rewards import extract_boxed

__all__ = ["KINDS", "Reformulation", "attach_compressions", "augment_limit", "plan_reformulations", "select_hard"]

KINDS = ("bcq", "ncq")


def augment_limit(num_new: int, fraction: float) -> int:
    """``floor(fraction * num_new)``: the pre-cap on hard questions and the post-cap on instances."""
    if num_new < 0:
        raise ValueError(f"num_new must be >= 0, got {num_new}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"augment fraction must be in [0, 1], got {fraction}")
    return math.floor(fraction * num_new + 1e-9)


@dataclass(frozen=True)
class Reformulation:
    """One planned BCQ or NCQ instance of a hard question.

    Attributes:
        kind: ``"bcq"`` or ``"ncq"``.
        key: the question's key (dataset row id).
        candidates: raw rollout texts still to compress, in prompt order (BCQ: already
            shuffled; NCQ: every parsed wrong rollout, in group order).
        wrong_answers: NCQ only: the distinct parsed wrong answers, first-seen order.
        teacher_position: BCQ only: the index in ``candidates`` of the teacher's rollout
            (for the candidate-match audit; never shown to the student).
    """

    kind: str
    key: Hashable
    candidates: tuple[str, ...]
    wrong_answers: tuple[str, ...] = ()
    teacher_position: int | None = None

    def candidate_answers(self) -> tuple[str | None, ...]:
        """The boxed answer of each candidate's source rollout."""
        return tuple(extract_boxed(text) for text in self.candidates)


def select_hard(
    accuracy: Mapping[Hashable, float],
    limit: int,
    threshold: float = 0.5,
    rng: random.Random | int | None = None,
) -> list[Hashable]:
    """The pre-cap: keys with ``accuracy < threshold``, ascending accuracy, at most ``limit``.

    Ties are broken uniformly at random by ``rng`` (a ``random.Random`` or a seed; the
    trainer passes the step's seeded RNG, identical on every rank), so when the new
    questions alone could fill the cap at one accuracy, replayed questions tied with them
    are as likely to be reformulated. The mapping's order carries no priority.
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    rng = rng if isinstance(rng, random.Random) else random.Random(rng)
    hard = [key for key, r in accuracy.items() if r < threshold]
    rng.shuffle(hard)  # a uniform order among ties ...
    hard.sort(key=lambda key: accuracy[key])  # ... that the stable sort keeps
    return hard[:limit]


def plan_reformulations(
    hard: Sequence[Hashable],
    teacher_correct: Mapping[Hashable, Sequence[str]],
    student_wrong: Mapping[Hashable, Sequence[str]],
    limit: int,
    kinds: Sequence[str] = KINDS,
    rng: random.Random | int | None = None,
) -> list[Reformulation]:
    """Plan BCQ/NCQ instances for the ranked hard questions and apply the post-cap.

    Args:
        hard: pre-capped keys, hardest first (:func:`select_hard`).
        teacher_correct: graded-correct teacher rollouts per key (missing = none).
        student_wrong: wrong plain student rollouts per key; those without a parsable
            ``\\boxed{}`` are left out of candidate construction.
        limit: the post-cap on instances (``rho_aug * |X_new|``).
        kinds: which reformulations are on (subset of ``("bcq", "ncq")``).
        rng: ``random.Random`` or seed for the BCQ draws and shuffle.

    Returns:
        At most ``limit`` instances, in walk order (per question: BCQ, then NCQ).
    """
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown reformulation kind(s) {sorted(unknown)}; expected a subset of {KINDS}")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    rng = rng if isinstance(rng, random.Random) else random.Random(rng)

    planned: list[Reformulation] = []
    for key in hard:
        if len(planned) >= limit:
            break
        parsed = [(text, answer) for text in student_wrong.get(key, ()) if (answer := extract_boxed(text)) is not None]
        if not parsed:
            continue  # no instance; the plain group still refreshes the buffer
        teacher = teacher_correct.get(key, ())
        if "bcq" in kinds and teacher:
            teacher_text = rng.choice(list(teacher))
            student_text = rng.choice(parsed)[0]
            teacher_first = rng.random() < 0.5
            planned.append(
                Reformulation(
                    kind="bcq",
                    key=key,
                    candidates=(teacher_text, student_text) if teacher_first else (student_text, teacher_text),
                    teacher_position=0 if teacher_first else 1,
                )
            )
        if "ncq" in kinds and len(planned) < limit:
            planned.append(
                Reformulation(
                    kind="ncq",
                    key=key,
                    candidates=tuple(text for text, _ in parsed),
                    wrong_answers=tuple(distinct_answers(answer for _, answer in parsed)),
                )
            )
    return planned


def attach_compressions(
    plan: Sequence[Reformulation], compressed: Sequence[str | None]
) -> tuple[list[tuple[Reformulation, tuple[str, ...]]], int]:
    """Pair each planned instance with its compressed candidates, where enough survived.

    ``compressed`` holds one result per candidate of ``plan``, in order (None: the
    compression failed). BCQ needs both of its candidates. An NCQ instance loses only the
    candidates whose compression failed (its wrong-answer list comes from the student's
    rollouts, not from the rewrites) and is dropped when none is left. A kept NCQ
    instance's ``candidates`` are narrowed to the surviving sources, so they stay aligned
    with the texts.

    Returns ``[(instance, compressed texts)]`` for the kept instances, in plan order, and
    the number of failed compressions.
    """
    expected = sum(len(inst.candidates) for inst in plan)
    if len(compressed) != expected:
        raise ValueError(f"{len(compressed)} compressions for {expected} candidates")
    results = iter(compressed)
    kept: list[tuple[Reformulation, tuple[str, ...]]] = []
    failed = 0
    for inst in plan:
        usable = [(source, text) for source in inst.candidates if (text := next(results))]
        failed += len(inst.candidates) - len(usable)
        if not usable or (inst.kind == "bcq" and len(usable) < len(inst.candidates)):
            continue
        if len(usable) < len(inst.candidates):
            inst = dataclasses.replace(inst, candidates=tuple(source for source, _ in usable))
        kept.append((inst, tuple(text for _, text in usable)))
    return kept, failed
