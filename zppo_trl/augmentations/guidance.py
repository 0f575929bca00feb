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
import re
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mathruler.math_normalize import normalize_answer

from ..needs import Needs
from ..prompt_sizes import PromptSizes, text_bytes
from ..prompts import hint_block
from ..rewards import strip_degree_percent
from .base import Augmentation, AugmentationInputs, BuiltGroup, BuiltGroups, Evidence, teacher_results

__all__ = ["Guidance", "HintedGuidance", "ResponsePrefix", "TeacherHint", "answer_free", "leaks_answer"]

# Inline-math delimiters: they separate an answer from the prose around it ("is $2$.").
_MATH_DELIMITERS = re.compile(r"\$|\\[()\[\]]")
_SENTENCE_PUNCTUATION = ".,;:!?"


def answer_free(hint: str) -> bool:
    """Whether a hint keeps the one checkable rule of the paper's hint-generation prompt: no ``\\boxed{}``
    expression."""
    return "\\boxed" not in hint


def _normalized(text: str) -> str:
    """The grader's string normalisation of an answer: its degree/percent strip
    (`zppo_trl.rewards.strip_degree_percent`), then mathruler's (MATH's) ``normalize_answer``, the
    first comparison of mathruler's ``grade_answer``."""
    return normalize_answer(strip_degree_percent(text)) or ""


def leaks_answer(hint: str, gold: Any) -> bool:
    """Whether ``hint`` states the gold answer ``gold`` (the rule the hint-generation prompt sets and
    cannot enforce).

    Both sides are compared as the grader's string step compares answers (no sympy): through the
    degree/percent strip and mathruler's ``normalize_answer``, which drops spaces, ``\\left``/``\\right``,
    ``\\!``, units in ``\\text{ }`` and a short left-hand side (``x = 2`` -> ``2``), and writes ``\\dfrac``,
    ``\\frac12``, ``1/2`` and ``0.5`` as ``\\frac{1}{2}``. The hint is cut into whitespace-separated
    tokens (``$``, ``\\(``, ``\\)``, ``\\[``, ``\\]`` count as whitespace), and it leaks when a run of
    consecutive tokens, without the sentence punctuation that ends it, normalises to the gold. Only
    whole tokens match, so a short gold is not found inside a longer number or expression: ``2`` is
    not stated by ``12``, ``2.5``, ``x^2`` or ``\\frac{1}{2}``, but is by ``2.``, ``$2$`` and ``x = 2``.
    What no text test can tell is left: a small number or a capital letter used for something else
    ("step 2"; the article "A" for a multiple-choice gold ``A``; "1 2" for ``12``) counts, so for such
    golds the rate is an upper bound. A run is at most twice the gold's length plus 8 characters long
    (room for what normalisation drops, such as ``x =`` or ``\\left``).
    """
    target = _normalized(str(gold))
    if not target:
        return False
    budget = 2 * len("".join(str(gold).split())) + 8
    tokens = _MATH_DELIMITERS.sub(" ", hint).split()
    for start in range(len(tokens)):
        length = 0
        for end in range(start, len(tokens)):
            length += len(tokens[end])
            if length > budget:
                break
            run = " ".join(tokens[start : end + 1]).rstrip(_SENTENCE_PUNCTUATION)
            if run and _normalized(run) == target:
                return True
    return False


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


@dataclass(frozen=True)
class HintedGuidance(Guidance):
    """A Hint instance whose hint was accepted: the hint, and whether it states the gold answer
    (:func:`leaks_answer`)."""

    hint: str = ""
    leaked: bool = False


class TeacherHint(_TeacherGuidance):
    """The Hint control (the paper's Hint-control algorithm and hint-generation prompt): the teacher
    reads one graded-correct rollout of its own and writes a hint; the student samples a group on the
    question with a ``<hint>`` block before the closer (training only; evaluation never shows one).

    The template forbids revealing the answer and any ``\\boxed{}``; a hint that still contains a
    ``\\boxed{`` is discarded (counted in ``hint_rejected``), so no hint in a prompt carries a boxed
    answer. An accepted hint that states the gold answer anyway (:func:`leaks_answer`, against
    ``answer_of(key)``) is counted (``hint_leaked``, ``hint_leak_rate``), not filtered: the paper does
    not filter. The request reuses the compression call's cap and sampling settings
    (``compression_max_tokens``, ``compression_extra_body``): both are short rewrites of one teacher
    rollout, and the paper gives the hint no cap of its own.
    """

    kind = "hint"
    kinds = ("hint",)

    @classmethod
    def teacher_role(cls, args: Any) -> str:
        return (
            "writes an answer-free hint from one of its graded-correct answers, "
            "shown in a `<hint>` block before the closer"
        )

    @classmethod
    def teacher_use(cls, args: Any) -> str:
        return f"hints <= {args.compression_max_tokens} tokens"

    @classmethod
    def prompt_blocks(cls, kinds: tuple[str, ...], sizes: PromptSizes) -> list[int]:
        return [text_bytes(hint_block("h")) - 1 + sizes.compression_max_tokens]

    summed_metrics = ("hint_rejected",)
    needs = Augmentation.needs | Needs(gold_answers=True)  # the leak count reads each question's gold answer

    def __init__(self, answer_of: Callable[[Hashable], Any]):
        self.answer_of = answer_of

    @classmethod
    def create(cls, kinds: tuple[str, ...], inputs: AugmentationInputs) -> TeacherHint:
        if inputs.answer_of is None:
            raise ValueError("the Hint control needs answer_of, the gold answers its leak count looks for")
        return cls(inputs.answer_of)

    def build(
        self, instances: Sequence[Guidance], teacher: Any, args: Any, metrics: dict, ready: Any = None
    ) -> BuiltGroups:
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
                leaked = leaks_answer(hint, self.answer_of(inst.key))
                built.groups.append(BuiltGroup(self.kind, inst.key, hint_block(hint)))
                built.instances.append(HintedGuidance(inst.kind, inst.key, inst.teacher_response, hint, leaked))
        metrics["hint_rejected"] = rejected
        return built

    def audit_counts(self, instances: Sequence[HintedGuidance], texts: Sequence[str], group_size: int) -> dict:
        """Accepted hints, and those that state the gold answer."""
        return {"hints": float(len(instances)), "leaked": float(sum(inst.leaked for inst in instances))}

    def audit_metrics(self, totals: Mapping[str, float]) -> dict[str, float]:
        hints, leaked = totals.get("hints", 0.0), totals.get("leaked", 0.0)
        return {"hint_leaked": leaked, "hint_leak_rate": leaked / hints if hints else 0.0}


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
    reads = {"prefix_fraction": ("prefix",)}
    enters = "open the student's *response* as a prefix it continues"
    # A Prefix group adds no block (prompt_blocks: none): its prefix and continuation share max_completion_length.

    @classmethod
    def teacher_role(cls, args: Any) -> str:
        return (
            f"opens the student's response with the first {args.prefix_fraction:.0%} of the tokens of one of its "
            "graded-correct answers, which the student continues"
        )

    @classmethod
    def teacher_use(cls, args: Any) -> str:
        return f"response prefix alpha={args.prefix_fraction:g}"

    summed_metrics = ("prefix_unusable",)

    @classmethod
    def check_settings(cls, args: Any) -> None:
        fraction = args.prefix_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction < 1.0:
            raise ValueError(f"prefix_fraction must be a number in (0, 1), got {fraction!r}")

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

    def build(
        self, instances: Sequence[Guidance], teacher: Any, args: Any, metrics: dict, ready: Any = None
    ) -> BuiltGroups:
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
