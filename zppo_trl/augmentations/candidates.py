"""ZPPO's own augmentation: BCQ and NCQ prompts, their candidates compressed by the teacher first.

BCQ shows one correct teacher answer and one wrong student answer, anonymised and shuffled; NCQ
lists the student's wrong answers as known-wrong and shows them as candidates. Both templates are
the paper's BCQ and NCQ prompt figures (`zppo_trl.prompts`); the planning is
`zppo_trl.reformulate.plan_reformulations`. What a BCQ candidate block shows (the whole compressed
candidate, or one of the paper's candidate-content controls) is `zppo_trl.augmentations.candidate_content`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..prompt_sizes import ANSWER_TOKENS, PromptSizes, text_bytes
from ..prompts import BCQ_INSTRUCTION, NCQ_INSTRUCTION, bcq_block, fill, ncq_block
from ..reformulate import KINDS, Reformulation, attach_compressions, plan_reformulations
from ..rewards import boxed_spans, extract_boxed, grade_batch
from .base import Augmentation, AugmentationInputs, BuiltGroup, BuiltGroups, Evidence, teacher_results
from .candidate_content import CandidateContent, candidate_content

__all__ = ["CandidateReformulation"]


class CandidateReformulation(Augmentation):
    """ZPPO's BCQ and NCQ prompts (the paper's BCQ and NCQ prompt templates), candidates compressed first."""

    reads = {"bcq_candidate_content": ("bcq",)}  # what a BCQ candidate block shows (its candidate-content controls)

    @classmethod
    def check_settings(cls, args: Any) -> None:
        candidate_content(args.bcq_candidate_content)  # an unknown content fails here, naming the field

    @classmethod
    def teacher_role(cls, args: Any) -> str:
        if args.compress_candidates:
            return f"compresses each candidate to at most {args.compression_max_tokens} tokens"
        return (
            "its answers and the student's enter BCQ/NCQ prompts uncompressed "
            "(`compress_candidates: false`, not the paper's setting)"
        )

    @classmethod
    def qualifiers(cls, args: Any) -> list[str]:
        printed = candidate_content(args.bcq_candidate_content).printed
        return [printed] if printed and "bcq" in args.augmentations else []

    @classmethod
    def teacher_use(cls, args: Any) -> str:
        if args.compress_candidates:
            use = f"compression <= {args.compression_max_tokens} tokens"
        else:
            use = "candidates uncompressed (compress_candidates: false)"
        printed = candidate_content(args.bcq_candidate_content).printed
        if printed and "bcq" in args.augmentations:
            use += f"; BCQ candidates {printed}"
        return use

    @classmethod
    def prompt_blocks(cls, kinds: tuple[str, ...], sizes: PromptSizes) -> list[int]:
        blocks, G = [], sizes.num_generations
        if "bcq" in kinds:  # the instruction and two candidates
            blocks.append(text_bytes(BCQ_INSTRUCTION) + 1 + 2 * sizes.candidate)
        if "ncq" in kinds:  # every rollout of the group wrong, each a distinct answer, each a candidate
            listed = G * (ANSWER_TOKENS + text_bytes(", \\boxed{}"))
            blocks.append(text_bytes(fill(NCQ_INSTRUCTION, answers="")) + listed + 1 + G * sizes.candidate)
        return blocks

    def __init__(self, kinds: Sequence[str] = KINDS, content: str = "full"):
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown reformulation kind(s) {sorted(unknown)}; expected a subset of {KINDS}")
        self.kinds = tuple(kind for kind in KINDS if kind in kinds)
        self.content: CandidateContent = candidate_content(content)
        # a candidate-content control counts what its transform met (summed over ranks by the trainer)
        self.summed_metrics = () if self.content.name == "full" else ("bcq_content_unboxed", "bcq_multiple_boxed")

    @classmethod
    def create(cls, kinds: tuple[str, ...], inputs: AugmentationInputs) -> CandidateReformulation:
        return cls(kinds, inputs.bcq_candidate_content)

    def plan(self, evidence: Evidence, limit: int, rng: random.Random, metrics: dict) -> list[Reformulation]:
        parsed = {
            key
            for key in evidence.hard
            if any(extract_boxed(t) is not None for t in evidence.student_wrong.get(key, ()))
        }
        metrics["hard"] = len(evidence.hard)
        metrics["hard_bcq_possible"] = sum(1 for key in parsed if evidence.teacher_correct.get(key))
        metrics["hard_ncq_only"] = len(parsed) - metrics["hard_bcq_possible"]
        planned = plan_reformulations(
            evidence.hard, evidence.teacher_correct, evidence.student_wrong, limit, self.kinds, rng=rng
        )
        questions = len({inst.key for inst in planned})
        metrics["teacher_success_rate"] = sum(inst.kind == "bcq" for inst in planned) / questions if questions else 0.0
        return planned

    def order(self, instances: Sequence[Reformulation]) -> list[Reformulation]:
        # BCQ first then NCQ, so that round-robin dealing gives every rank a mix of both kinds.
        return sorted(instances, key=lambda inst: inst.kind != "bcq")

    def build(
        self, instances: Sequence[Reformulation], teacher: Any, args: Any, metrics: dict, ready: Any = None
    ) -> BuiltGroups:
        """Compress this rank's candidates (one teacher batch) and render each kept instance's block.

        BCQ needs both candidates compressed; NCQ keeps the ones that compressed
        (`zppo_trl.reformulate.attach_compressions`). With ``compress_candidates`` off (not the
        paper's setting) the raw rollouts are the candidates and the teacher is not called.
        With ``ready``, each instance's group is handed on as soon as its own candidates are back, rendered
        as the whole build renders it (a pipelined second round sends its prompt then).
        """
        if not instances:
            return BuiltGroups()
        t0 = time.perf_counter()
        sources = [text for inst in instances for text in inst.candidates]
        if args.compress_candidates:

            def early(inst: Reformulation, texts: list[str | None]) -> None:
                for group in self.render(attach_compressions([inst], texts)[0], {}).groups:
                    ready(group)

            future = teacher.compress_async(
                sources,
                max_tokens=args.compression_max_tokens,
                temperature=args.teacher_temperature,
                top_p=args.teacher_top_p,
                extra_body=args.compression_extra_body,
                on_each=each_instance(instances, early) if ready is not None else None,
            )
            compressed = teacher_results(future, [None] * len(sources))
        else:
            compressed = list(sources)
        metrics["time/compression_s"] = time.perf_counter() - t0
        kept, failed = attach_compressions(instances, compressed)
        built = self.render(kept, metrics)
        built.failures = failed
        return built

    def render(self, kept: Sequence[tuple[Reformulation, tuple[str, ...]]], metrics: dict) -> BuiltGroups:
        """The blocks of the instances that kept their compressed candidates (``attach_compressions``): a BCQ
        pair shown under the configured candidate content (both candidates alike), NCQ's candidates as they
        are. A BCQ pair the content cannot show is dropped (``bcq_content_unboxed``)."""
        built = BuiltGroups()
        for inst, texts in kept:
            if inst.kind == "bcq" and self.content.name != "full":
                texts = self._shown(texts, metrics)
                if texts is None:
                    continue
            block = bcq_block(texts) if inst.kind == "bcq" else ncq_block(inst.wrong_answers, texts)
            built.groups.append(BuiltGroup(inst.kind, inst.key, block))
            built.instances.append(inst)
            built.shown.append(tuple(texts))
        return built

    def _shown(self, texts: Sequence[str], metrics: dict) -> tuple[str, ...] | None:
        """Both compressed candidates of a BCQ pair under the configured content, or None (the instance is
        dropped, counted in ``bcq_content_unboxed``) when either has no closed, non-empty boxed answer.
        Candidates with more than one box are counted in ``bcq_multiple_boxed``."""
        metrics["bcq_multiple_boxed"] = metrics.get("bcq_multiple_boxed", 0) + sum(
            len(boxed_spans(text) or ()) > 1 for text in texts
        )
        shown = tuple(self.content.transform(text) for text in texts)
        if any(text is None for text in shown):
            metrics["bcq_content_unboxed"] = metrics.get("bcq_content_unboxed", 0) + 1
            return None
        return shown

    def audit_counts(
        self, instances: Sequence[Reformulation], texts: Sequence[str], group_size: int
    ) -> dict[str, float]:
        """Which candidate's answer each BCQ rollout gave (teacher's, student's, neither), and how
        many NCQ rollouts repeat a listed wrong answer."""
        counts = dict.fromkeys(("bcq_teacher", "bcq_student", "bcq_neither", "ncq_repeats", "ncq_rollouts"), 0.0)
        for g, inst in enumerate(instances):
            group = texts[g * group_size : (g + 1) * group_size]
            answers = inst.candidate_answers()
            if inst.kind == "bcq":
                teacher = grade_batch(group, [answers[inst.teacher_position]] * len(group))
                student = grade_batch(group, [answers[1 - inst.teacher_position]] * len(group))
                for t, s in zip(teacher, student, strict=False):
                    counts["bcq_teacher" if t else "bcq_student" if s else "bcq_neither"] += 1
            else:
                repeats = [False] * len(group)
                for wrong in inst.wrong_answers:
                    repeats = [a or b for a, b in zip(repeats, grade_batch(group, [wrong] * len(group)), strict=False)]
                counts["ncq_repeats"] += sum(repeats)
                counts["ncq_rollouts"] += len(group)
        return counts

    def audit_metrics(self, totals: Mapping[str, float]) -> dict[str, float]:
        bcq = sum(totals.get(f"bcq_{name}", 0.0) for name in ("teacher", "student", "neither"))
        out = {
            f"bcq_match_{name}": totals.get(f"bcq_{name}", 0.0) / bcq if bcq else 0.0
            for name in ("teacher", "student", "neither")
        }
        rollouts = totals.get("ncq_rollouts", 0.0)
        out["ncq_repeat_rate"] = totals.get("ncq_repeats", 0.0) / rollouts if rollouts else 0.0
        return out


def each_instance(
    instances: Sequence[Reformulation], done: Callable[[Reformulation, list[str | None]], None]
) -> Callable[[int, str | None], None]:
    """A per-candidate callback (the order of ``instances``' candidates, as compressed) that calls ``done(instance,
    its compressions)`` once every candidate of that instance is back."""
    owner = [i for i, inst in enumerate(instances) for _ in inst.candidates]
    start = [sum(len(inst.candidates) for inst in instances[:i]) for i in range(len(instances))]
    results: list[list[str | None]] = [[None] * len(inst.candidates) for inst in instances]
    left = [len(inst.candidates) for inst in instances]
    lock = threading.Lock()

    def on_each(index: int, result: str | None) -> None:
        i = owner[index]
        with lock:
            results[i][index - start[i]] = result
            left[i] -= 1
            complete = left[i] == 0
        if complete:
            done(instances[i], results[i])

    return on_each
