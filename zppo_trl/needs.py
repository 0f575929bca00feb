"""What a part of a row asks of the run, declared once: :class:`Needs`.

Every part of a configuration's row declares its needs: the step-5 part (its class's ``needs``: an augmentation, a
target source such as a distillation mode, or none), the step-6 objective (its registered loss's ``needs``) and each
named term (:mod:`zppo_trl.terms`). A row's needs are their union, resolved once from the config
(:func:`zppo_trl.row.resolve_row`); the trainer, the config's checks, the dry run and its memory plan, the model
card and the launcher's server list read that union and never test a row's name.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["COPY_EMA", "COPY_FROZEN", "SCORES_TOKEN_LOGPS", "SCORES_TOP_K", "Needs"]

# What the teacher scores on the trained rows (Needs.teacher_scores): its top-k next-token log-probs at every
# completion position (the distillation rows, RSTG), or its log-prob of each sampled token (KDRL, RLAD).
SCORES_TOP_K = "top_k"
SCORES_TOKEN_LOGPS = "token_logps"
# A copy of the student kept next to it on every rank (Needs.student_copies): moved towards it after optimizer
# steps (an EMA: GRPO-CARE's reference, SDPO's self-teacher), or the initial student, frozen (OPSD's).
COPY_EMA = "ema"
COPY_FROZEN = "frozen"


@dataclass(frozen=True)
class Needs:
    """What one part of a row asks of the run; ``a | b`` is what both ask.

    Attributes:
        teacher_samples: step 2 samples G_T teacher replies to every question of the step.
        teacher_requests: the part sends the teacher server requests of its own (compression, hints, corrections).
        teacher_scores: what the teacher scores on the trained rows (:data:`SCORES_TOP_K`,
            :data:`SCORES_TOKEN_LOGPS`): asked of its server, or computed by ``distill_teacher`` loaded next to the
            student where one is set.
        judge: a judge client of the part's own (``judge_base_url``/``judge_model``, defaulting to the teacher's).
        student_copies: each copy of the student kept on every rank (:data:`COPY_EMA`, :data:`COPY_FROZEN`), by
            the checkpoint file that holds it.
        sampling_logps_at_scoring: the sampling policy's log-probs are read while the step is scored, so TRL
            computes them then (``defer_old_logps`` does not apply).
        trains_zero_advantage: a partition without a group of mixed rewards still trains.
        plain_pipeline_only: the part reads GRPO†'s plain rollouts: no augmentation, no distillation.
        token_level_objective: the part gives each token its own advantage: a sequence-level objective is refused.
        gold_answers: the part reads each question's gold answer (the dataset's ``answer`` column) itself, besides
            what the reward functions read.
    """

    teacher_samples: bool = False
    teacher_requests: bool = False
    teacher_scores: frozenset[str] = frozenset()
    judge: bool = False
    student_copies: frozenset[tuple[str, str]] = frozenset()
    sampling_logps_at_scoring: bool = False
    trains_zero_advantage: bool = False
    plain_pipeline_only: bool = False
    token_level_objective: bool = False
    gold_answers: bool = False

    def __or__(self, other: Needs) -> Needs:
        if not isinstance(other, Needs):
            return NotImplemented
        return Needs(**{f.name: getattr(self, f.name) | getattr(other, f.name) for f in fields(self)})

    @property
    def student_copy_kinds(self) -> tuple[str, ...]:
        """The kinds of the student copies, in checkpoint-file order."""
        return tuple(kind for _file, kind in sorted(self.student_copies))
