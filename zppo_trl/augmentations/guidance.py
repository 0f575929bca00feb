"""The paper's Hint and Prefix controls: one graded-correct teacher rollout guides one extra group.

Each makes one extra group per hard question that has a graded-correct teacher rollout, built
from one such rollout drawn uniformly: `TeacherHint` puts an answer-free ``<hint>`` block, written
by the teacher from that rollout, before the closer (the paper's Hint-control algorithm);
`ResponsePrefix` opens the student's response with the rollout's first ``floor(alpha * L)``
tokens, which the student continues and which carry no loss (the paper's Prefix-control algorithm).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from ..prompts import hint_block
from .base import Augmentation, AugmentationInputs, BuiltGroup, BuiltGroups, Evidence, teacher_results

__all__ = ["Guidance", "ResponsePrefix", "TeacherHint", "answer_free"]


def answer_free(hint: str) -> bool:
    """Whether a hint keeps the one checkable rule of the paper's hint-generation prompt: no ``\\boxed{}``
    expression."""
    return "\\boxed" not in hint


@dataclass(frozen=True)
class Guidance:
    """One planned Hint or Prefix instance: a hard question and the graded-correct teacher
    rollout (drawn uniformly among its correct ones) that guides its extra group."""

    kind: str
    key: Hashable
    teacher_response: str


class _TeacherGuidance(Augmentation):
    """Planning shared by the Hint and Prefix controls (the "shared augmentation-branch convention").

    Walks the pre-capped hard questions, hardest first, and plans one instance for each that has
    at least one graded-correct teacher rollout (``N_x > 0``), one such rollout drawn uniformly;
    at most ``limit`` instances. A question without one contributes no group.
    """

    kind = ""

    def plan(self, evidence: Evidence, limit: int, rng: random.Random, metrics: dict) -> list[Guidance]:
        metrics["hard"] = len(evidence.hard)
        solved = [key for key in evidence.hard if evidence.teacher_correct.get(key)]
        metrics[f"hard_{self.kind}_possible"] = len(solved)
        return [Guidance(self.kind, key, rng.choice(list(evidence.teacher_correct[key]))) for key in solved[:limit]]


class TeacherHint(_TeacherGuidance):
    """The Hint control (the paper's Hint-control algorithm and hint-generation prompt): the teacher
    reads one graded-correct rollout of its own and writes a hint; the student samples a group on the
    question with a ``<hint>`` block before the closer (training only; evaluation never shows one).

    The template forbids revealing the answer and any ``\\boxed{}``; a hint that still contains a
    ``\\boxed{`` is discarded (counted in ``hint_rejected``), so no hint in a prompt carries a boxed
    answer. The request reuses the compression call's cap and sampling settings
    (``compression_max_tokens``, ``compression_extra_body``): both are short rewrites of one teacher
    rollout, and the paper gives the hint no cap of its own.
    """

    kind = "hint"
    kinds = ("hint",)
    summed_metrics = ("hint_rejected",)

    def build(self, instances: Sequence[Guidance], teacher: Any, args: Any, metrics: dict) -> BuiltGroups:
        if not instances:
            return BuiltGroups()
        t0 = time.perf_counter()
        future = teacher.hint_async(
            [inst.teacher_response for inst in instances],
            max_tokens=args.compression_max_tokens,
            temperature=args.teacher_temperature,
            top_p=args.teacher_top_p,
            extra_body=args.compression_extra_body,
        )
        hints = teacher_results(future, [None] * len(instances))
        metrics["time/compression_s"] = time.perf_counter() - t0
        built = BuiltGroups()
        rejected = 0
        for inst, hint in zip(instances, hints, strict=False):
            if hint is None:
                built.failures += 1
            elif not answer_free(hint):
                rejected += 1
            else:
                built.groups.append(BuiltGroup(self.kind, inst.key, hint_block(hint)))
                built.instances.append(inst)
        metrics["hint_rejected"] = rejected
        return built


class ResponsePrefix(_TeacherGuidance):
    """The Prefix control (the paper's Prefix-control algorithm, alpha = 0.4): the first
    ``floor(alpha * L)`` tokens of one graded-correct teacher rollout open the student's response;
    the student continues it.

    ``L`` counts the rollout's tokens under the student's tokenizer (the paper's teacher and
    student share a tokenizer family). The prompt is unchanged. The trainer conditions the group's
    rollouts on the prefix (it ends the generation prompt), so no prefix token is sampled by the
    student or enters the loss, and grades ``prefix || continuation``; prefix and continuation share
    ``max_completion_length``. A prefix that would leave no room to continue is dropped.
    """

    kind = "prefix"
    kinds = ("prefix",)
    summed_metrics = ("prefix_unusable",)

    def __init__(self, tokenizer: Any, fraction: float = 0.4):
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"prefix_fraction (alpha) must be in (0, 1), got {fraction}")
        self.tokenizer = tokenizer
        self.fraction = fraction

    @classmethod
    def create(cls, kinds: tuple[str, ...], inputs: AugmentationInputs) -> ResponsePrefix:
        if inputs.tokenizer is None:
            raise ValueError(
                "the Prefix control needs the student's tokenizer to cut the teacher's rollout into tokens"
            )
        return cls(inputs.tokenizer, inputs.prefix_fraction)

    def prefix_ids(self, response: str) -> tuple[int, ...]:
        """The first ``floor(alpha * L)`` token ids of ``response`` (no special tokens added)."""
        ids = self.tokenizer(response, add_special_tokens=False)["input_ids"]
        return tuple(ids[: math.floor(self.fraction * len(ids) + 1e-9)])

    def build(self, instances: Sequence[Guidance], teacher: Any, args: Any, metrics: dict) -> BuiltGroups:
        built = BuiltGroups()
        unusable = 0
        for inst in instances:
            prefix = self.prefix_ids(inst.teacher_response)
            if not prefix or len(prefix) >= args.max_completion_length:
                unusable += 1
                continue
            built.groups.append(BuiltGroup(self.kind, inst.key, None, prefix))
            built.instances.append(inst)
        metrics["prefix_unusable"] = unusable
        return built
