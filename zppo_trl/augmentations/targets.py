"""The supervised controls of the paper's mistakes table: Correction-SFT and Error-reflection-SFT.

Both are step-5 target sources (:class:`zppo_trl.augmentations.TargetSource`) whose instances are
supervised targets, not groups to sample: the trainer fits them with cross-entropy on their
response tokens (prompt and tag tokens masked), in the same optimizer partitions as the RL rows
(a partition without a verified target is skipped), and the student's plain rollouts only rank
the hard questions and refresh the buffer. Every target is graded by the trainer's own reward
functions before it becomes one.

- Correction-SFT (the paper's Correction-SFT algorithm and correction-generation prompt; after
  LeMa and NAT): for each hard question, one wrong student rollout drawn uniformly; the teacher
  corrects it in one call. A correction graded correct gives two instances: the correction under
  ``<correct>`` and the wrong rollout under ``<incorrect>`` (the tag before the closer).
  Evaluation keeps ``<correct>`` (``evaluation_condition``: the trainer records it in the saved config).
- Error-reflection-SFT (the paper's Error-reflection-SFT algorithm and error-conditioned refinement
  prompt; after ORION): for each hard question with a graded-correct teacher rollout (of the G_T
  drafts), one draft drawn uniformly is revised by the teacher with all the question's wrong
  student rollouts, in full; a revision graded correct is the target under the bare question.

Teacher requests carry the question's images, like the teacher's own rollouts; the templates are
the paper's text. Pure of TRL: the trainer hands in how to build a chat and how to grade.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from ..needs import Needs
from ..prompt_sizes import CHAT_TOKENS, PromptSizes, text_bytes
from ..prompts import (
    CORRECT_TAG,
    CORRECTION_TEMPLATE,
    INCORRECT_TAG,
    REFLECTION_TEMPLATE,
    fill,
    render_correction,
    render_reflection,
)
from .base import AugmentationInputs, BuiltGroup, BuiltGroups, Evidence, TargetSource, teacher_results

__all__ = ["CorrectionTargets", "ReflectionTargets", "SupervisedInstance"]

# key, text -> the teacher chat: the question's images (if any), then the text.
TeacherChat = Callable[[Hashable, str], list]
# keys, responses per key -> one verdict per response, by the trainer's reward functions (all in one call).
Grader = Callable[[Sequence[Hashable], Sequence[Sequence[str]]], list]
# key -> the question text (without the closer).
QuestionOf = Callable[[Hashable], str]


@dataclass(frozen=True)
class SupervisedInstance:
    """One planned Correction-SFT or Error-reflection-SFT instance of a hard question.

    ``source`` is the wrong student rollout to correct, or the teacher draft to revise;
    ``attempts`` are the question's wrong student rollouts the revision reads (reflection only).
    """

    kind: str
    key: Hashable
    source: str
    attempts: tuple[str, ...] = ()


class _SupervisedTargets(TargetSource):
    """Planning and building shared by the two supervised controls."""

    kind = ""

    def __init__(self, question_of: QuestionOf, teacher_chat: TeacherChat, grade: Grader):
        self.kinds = (self.kind,)
        self.summed_metrics = (f"{self.kind}_rejected",)
        self.question_of = question_of
        self.teacher_chat = teacher_chat
        self.grade = grade

    @classmethod
    def create(cls, kinds: tuple[str, ...], inputs: AugmentationInputs) -> _SupervisedTargets:
        if None in (inputs.question_of, inputs.teacher_chat, inputs.grade):
            raise ValueError(f"the {kinds[0]} control needs question_of, teacher_chat and grade")
        return cls(inputs.question_of, inputs.teacher_chat, inputs.grade)

    def _requests(self, instances: Sequence[SupervisedInstance]) -> list[list]:
        raise NotImplementedError

    def _targets(self, inst: SupervisedInstance, reply: str) -> list[BuiltGroup]:
        raise NotImplementedError

    def build(
        self, instances: Sequence[SupervisedInstance], teacher: Any, args: Any, metrics: dict, ready: Any = None
    ) -> BuiltGroups:
        """One teacher call per instance (the corrector or refiner, at the teacher's own sampling
        settings and cap), the replies graded together; only a verified reply becomes a target."""
        built = BuiltGroups()
        if not instances:
            return built
        t0 = time.perf_counter()
        future = teacher.sample_async(
            self._requests(instances),
            n=1,
            max_tokens=args.teacher_max_tokens,
            temperature=args.teacher_temperature,
            top_p=args.teacher_top_p,
        )
        replies = teacher_results(future, [[] for _ in instances])
        metrics["time/compression_s"] = time.perf_counter() - t0
        answered = [(inst, reply[0]) for inst, reply in zip(instances, replies, strict=True) if reply]
        built.failures += len(instances) - len(answered)
        verdicts = self.grade([inst.key for inst, _ in answered], [[text] for _, text in answered])
        rejected = 0
        for (inst, text), (verified,) in zip(answered, verdicts, strict=True):
            if not verified:
                rejected += 1
            else:
                built.groups += self._targets(inst, text)
                built.instances.append(inst)
        metrics[f"{self.kind}_rejected"] = rejected
        return built


class CorrectionTargets(_SupervisedTargets):
    """Correction-SFT: the teacher corrects one wrong student rollout per hard question.

    Needs no teacher rollouts (one corrector call per question), so step 2 samples none.
    A hard question without a wrong rollout (possible only when every rollout was unscorable) is
    skipped. The checkpoint is evaluated under ``<correct>``, the tag its corrections trained under
    (the paper's Correction-SFT algorithm).
    """

    kind = "correction"
    needs = Needs(teacher_requests=True)  # one corrector call per question, no G_T rollouts
    evaluation_condition = CORRECT_TAG
    printed = "Correction-SFT"  # as the paper's mistakes table prints it
    fits = "teacher corrections of its wrong answers (and those answers, tagged)"

    @classmethod
    def teacher_role(cls, args: Any) -> str:
        return "corrects one wrong student answer per hard question"

    @classmethod
    def teacher_use(cls, args: Any) -> str:
        return "corrects one wrong rollout per hard question; graded SFT targets"

    @classmethod
    def prompt_blocks(cls, kinds: tuple[str, ...], sizes: PromptSizes) -> list[int]:
        return [text_bytes(INCORRECT_TAG)]  # the polarity tag

    @classmethod
    def teacher_request(cls, sizes: PromptSizes) -> int:
        """The corrector's request reads one wrong rollout."""
        template = text_bytes(fill(CORRECTION_TEMPLATE, question="", incorrect_attempt=""))
        return (
            CHAT_TOKENS + template + sizes.max_prompt_length + sizes.max_completion_length + sizes.teacher_max_tokens
        )

    def plan(self, evidence: Evidence, limit: int, rng: random.Random, metrics: dict) -> list[SupervisedInstance]:
        metrics["hard"] = len(evidence.hard)
        usable = [key for key in evidence.hard if evidence.student_wrong.get(key)]
        return [
            SupervisedInstance(self.kind, key, rng.choice(list(evidence.student_wrong[key]))) for key in usable[:limit]
        ]

    def _requests(self, instances):
        return [
            self.teacher_chat(inst.key, render_correction(self.question_of(inst.key), inst.source))
            for inst in instances
        ]

    def _targets(self, inst, reply):
        return [
            BuiltGroup(self.kind, inst.key, CORRECT_TAG, target=reply),
            BuiltGroup(self.kind, inst.key, INCORRECT_TAG, target=inst.source),
        ]


class ReflectionTargets(_SupervisedTargets):
    """Error-reflection-SFT: the teacher revises one of its graded-correct drafts with all the
    question's wrong student rollouts; the target trains under the bare question."""

    kind = "reflection"
    printed = "Error-reflection-SFT"
    fits = "teacher revisions written from its wrong answers"

    @classmethod
    def teacher_role(cls, args: Any) -> str:
        return "revises one of its correct answers with the student's wrong ones"

    @classmethod
    def teacher_use(cls, args: Any) -> str:
        return "revises a correct draft with the wrong rollouts; graded SFT targets"

    @classmethod
    def teacher_request(cls, sizes: PromptSizes) -> int:
        """The reviser's request reads a teacher draft and every wrong rollout of the group, in full."""
        template = text_bytes(fill(REFLECTION_TEMPLATE, question="", draft="", student_attempts=""))
        return (
            CHAT_TOKENS
            + template
            + sizes.max_prompt_length
            + 2 * sizes.teacher_max_tokens
            + sizes.num_generations * (sizes.max_completion_length + 1)
        )

    def plan(self, evidence: Evidence, limit: int, rng: random.Random, metrics: dict) -> list[SupervisedInstance]:
        metrics["hard"] = len(evidence.hard)
        usable = [
            key for key in evidence.hard if evidence.teacher_correct.get(key) and evidence.student_wrong.get(key)
        ]
        metrics["hard_reflection_possible"] = len(usable)
        return [
            SupervisedInstance(
                self.kind, key, rng.choice(list(evidence.teacher_correct[key])), tuple(evidence.student_wrong[key])
            )
            for key in usable[:limit]
        ]

    def _requests(self, instances):
        return [
            self.teacher_chat(inst.key, render_reflection(self.question_of(inst.key), inst.source, inst.attempts))
            for inst in instances
        ]

    def _targets(self, inst, reply):
        return [BuiltGroup(self.kind, inst.key, None, target=reply)]
