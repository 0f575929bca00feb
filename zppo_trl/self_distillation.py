"""The self-teacher rows: the student, given privileged context, distilled back into itself on its own rollouts.

The paper's appendix on teacher-side alternatives has two rows whose teacher is the student itself, each a named
term on the GRPO† pipeline (replay buffer, no BCQ/NCQ). Each is a policy objective here, GRPO's plus its term, and
a :class:`SelfTeacher` in :data:`SELF_TEACHERS` saying where its privileged context comes from, which weights
score, and what signal they leave for the loss.

**SDPO** (Hübotter et al. 2026, "Reinforcement Learning via Self-Distillation", arXiv 2601.20802) "conditions a
self-teacher on rollout feedback and distills that teacher back into the student on its own rollouts"
(``policy_objective: sdpo``):

1. The context. A rollout's self-teacher prompt is its plain prompt followed by a correct rollout of the same
   group, never itself: the first other rollout with a correct answer, its reasoning block removed, in the
   official code's templates (:data:`SDPO_REPROMPT`, :data:`SDPO_SOLUTION`; the YAML its experiments ran, which
   has no trailing newlines). A rollout whose group has no other correct rollout has no self-teacher and leaves
   the term (its mask is 0). The corpus gives no textual environment feedback, so ``{feedback}`` is empty, as in
   SDPO's runs without rich feedback.
2. The teacher. A copy of the initial student, moved towards the student after every optimizer step,
   ``theta_T <- (1 - rate) theta_T + rate theta`` with the official default rate 0.05. Its log-prob of each
   sampled token, teacher-forced after the self-teacher prompt, is computed once per rollout step, before the
   step's updates (as the old log-probs are).
3. The term. The sampled-token reverse KL, TRL's experimental SDPO default: per sampled token
   ``sg(log pi_theta - log pi_T) log pi_theta`` (its gradient is the reverse KL's at that token), weighted by the
   importance ratio to the sampling policy, stopped from the gradient and capped at 2
   (``sg(min(pi_theta / pi_old, 2))``). It is added to GRPO's objective with weight ``self_distill_weight``
   (1), summed over the self-distilled tokens and divided by the update's loss-token count as GRPO's term is.

Choices where SDPO leaves the row open (docs/comparison_rows.md says the same): the official default divergence is
a top-100-logit JSD (alpha 0.5) and the official loss replaces the policy gradient; this row keeps GRPO's objective
(the paper's "adds a named term") and uses the sampled-token form, which needs only one teacher log-prob per token.

**OPSD** (Zhao et al. 2026, "Self-Distilled Reasoner: On-Policy Self-Distillation for Large Language Models",
arXiv 2601.18734) "conditions a self-teacher on privileged reasoning traces and matches its per-token distribution
on the student's own rollouts" (``policy_objective: opsd``):

1. The context. OPSD's privileged trace is a reference solution; the corpus keeps none (its released traces are
   dropped when it is built), so the trace is the frozen teacher's graded-correct reply to the question, as ZPPO's
   BCQ candidate is: the first of its G_T replies the reward grades correct, its reasoning block removed, in OPSD's
   reference-solution block and transition instruction (:func:`opsd_block`), between the question and the closer.
   A question the teacher never answered correctly has no self-teacher (its rollouts leave the term).
2. The teacher. The initial student, frozen (OPSD fixes the teacher to the initial policy).
3. The term. OPSD's per-token divergence between the self-teacher's and the student's next-token distributions,
   GKD's generalized JSD with ``opsd_beta`` 0.5 (its first version's choice; 0 is its later forward KL), over the
   self-teacher's top ``opsd_top_k`` tokens plus one bucket for the rest (the support of this project's
   distillation rows), added to GRPO's objective with weight ``self_distill_weight``, summed over the distilled
   tokens and divided by the update's loss-token count. The top-k is computed once per rollout step (the teacher
   does not move).

This module is pure: torch and the prompt helpers only, no TRL, no trainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .distill import chunked_jsd
from .losses import LossInputs, LossOutput, _old_logps, dapo_loss, register_loss
from .needs import Needs
from .prompts import compose_prompt
from .teacher import strip_thinking

__all__ = [
    "OPSD_BETA",
    "OPSD_TOP_K",
    "SDPO_IS_CLIP",
    "SDPO_REPROMPT",
    "SDPO_SOLUTION",
    "SDPO_TEACHER_UPDATE_RATE",
    "SELF_TEACHERS",
    "SelfTeacher",
    "opsd_block",
    "opsd_context",
    "sdpo_context",
    "sdpo_demonstrations",
    "self_distillation_per_token",
]

# SDPO's official reprompt templates (lasgroup/SDPO, the actor YAML its experiments ran), word for word.
SDPO_REPROMPT = "{prompt}{solution}{feedback}\n\nCorrectly solve the original question."
SDPO_SOLUTION = "\nCorrect solution:\n\n{successful_previous_attempt}"
# SDPO's official defaults: the EMA teacher's update rate per optimizer step, and the importance-ratio cap.
SDPO_TEACHER_UPDATE_RATE = 0.05
SDPO_IS_CLIP = 2.0

# OPSD's reference-solution block and transition instruction (siyan-zhao/OPSD's teacher prompt), word for word.
_OPSD_REFERENCE = (
    "Here is a reference solution to this problem:\n=== Reference Solution Begin ===\n{solution}\n"
    "=== Reference Solution End ==="
)
_OPSD_TRANSITION = (
    "After reading the reference solution above, make sure you truly understand the reasoning behind each step "
    "\u2014 do not copy or paraphrase it. Now, using your own words and independent reasoning, derive the same final "
    "answer to the problem above. Think step by step, explore different approaches, and don't be afraid to "
    "backtrack or reconsider if something doesn't work out:"
)
# OPSD's first version: the generalized JSD at beta 0.5; the support of this project's distillation rows.
OPSD_BETA = 0.5
OPSD_TOP_K = 20


@dataclass(frozen=True)
class SelfTeacher:
    """What a self-teacher row needs of the trainer: where its privileged context comes from (``"sibling"``: a
    correct rollout of the same group; ``"teacher_reference"``: the frozen teacher's graded-correct reply, so the
    row samples the teacher), whether its weights follow the student (an EMA) or stay the initial ones, and the
    signal it leaves for the loss (``"token_logps"``: its log-prob of each sampled token; ``"top_k"``: its top-k
    next-token log-probs at each position)."""

    context: str
    moves: bool
    signal: str

    @property
    def samples_teacher(self) -> bool:
        return self.context == "teacher_reference"


SELF_TEACHERS: dict[str, SelfTeacher] = {
    "sdpo": SelfTeacher(context="sibling", moves=True, signal="token_logps"),
    "opsd": SelfTeacher(context="teacher_reference", moves=False, signal="top_k"),
}


def sdpo_demonstrations(correct: Sequence[bool], group_size: int) -> list[int | None]:
    """For each rollout (groups of ``group_size`` in a row), the index of the first *other* correct rollout of its
    group, or None when its group has none: SDPO's successful demonstration, never the rollout itself."""
    if len(correct) % group_size:
        raise ValueError(f"{len(correct)} rollouts do not form groups of {group_size}")
    demonstrations: list[int | None] = []
    for i in range(len(correct)):
        start = i - i % group_size
        others = (j for j in range(start, start + group_size) if j != i and correct[j])
        demonstrations.append(next(others, None))
    return demonstrations


def sdpo_context(prompt: str, demonstration: str) -> str:
    """The self-teacher's user message: the plain prompt's text, then the demonstration (its reasoning block
    removed, as the official runs do) in SDPO's solution template, then its closing instruction."""
    solution = SDPO_SOLUTION.format(successful_previous_attempt=strip_thinking(demonstration).strip())
    return SDPO_REPROMPT.format(prompt=prompt, solution=solution, feedback="")


def opsd_block(reference: str) -> str:
    """OPSD's privileged block: the reference solution (its reasoning block removed) in OPSD's delimiters, then its
    instruction to derive the answer independently."""
    solution = strip_thinking(reference).strip()
    if not solution:
        raise ValueError("an OPSD reference needs a non-empty solution")
    return f"{_OPSD_REFERENCE.format(solution=solution)}\n\n{_OPSD_TRANSITION}"


def opsd_context(question: str, reference: str, closer: str | None) -> str:
    """The OPSD self-teacher's user message: the student's prompt (question, closer) with :func:`opsd_block` between
    them, as OPSD's teacher prompt places the reference between the problem and its closing instruction."""
    return compose_prompt(question, opsd_block(reference), closer)


def self_distillation_per_token(
    logps: torch.Tensor, teacher_logps: torch.Tensor, old_logps: torch.Tensor, is_clip: float | None
) -> torch.Tensor:
    """The sampled-token self-distillation loss per token, ``sg(log pi - log pi_T) log pi``, times
    ``sg(min(pi / pi_old, is_clip))`` (no weight when ``is_clip`` is None). Its gradient is
    ``(log pi - log pi_T) grad log pi``: each sampled token is pushed towards the self-teacher's probability."""
    per_token = (logps - teacher_logps).detach() * logps
    if is_clip is None:
        return per_token
    ratio = torch.exp(torch.clamp((logps - old_logps).detach(), -20.0, 20.0)).clamp(max=is_clip)
    return per_token * ratio


def _self_distillation_term(inputs: LossInputs, args: Any, is_clip: float | None, out: LossOutput) -> LossOutput:
    """``out`` (GRPO's objective) plus ``self_distill_weight`` times the term over the self-distilled tokens,
    divided by the update's token count; logs the mean sampled log-ratio ``log pi - log pi_T`` (an estimate of the
    reverse KL, ``self_distill/log_ratio``) and the share of loss tokens the term reached (``self_distill/tokens``)."""
    if inputs.teacher_logps is None or inputs.teacher_mask is None:  # a batch ZPPO did not build (TRL's evaluation)
        return out
    mask = inputs.mask * inputs.teacher_mask
    per_token = self_distillation_per_token(inputs.logps, inputs.teacher_logps, _old_logps(inputs), is_clip)
    out.loss = out.loss + args.self_distill_weight * (per_token * mask).sum() / inputs.normalizer
    gap = (inputs.logps.detach() - inputs.teacher_logps).to(torch.float64)
    count = mask.sum().to(torch.float64)
    out.means["self_distill/log_ratio"] = ((gap * mask).sum(), count)
    out.means["self_distill/tokens"] = (count, inputs.mask.sum().to(torch.float64))
    return out


# the term acts on rollouts of groups without a mixed reward too (an all-correct group's rollouts have siblings to
# learn from), so a partition with no advantage still trains
@register_loss(
    "sdpo",
    objective="sdpo",
    printed="SDPO",
    dual_clip=True,
    self_teacher=True,
    needs=Needs(trains_zero_advantage=True),
)
def sdpo_loss(inputs: LossInputs, args: Any) -> LossOutput:
    """GRPO's objective plus SDPO's sampled-token self-distillation to the EMA self-teacher, its importance ratio
    capped at ``sdpo_is_clip``."""
    return _self_distillation_term(inputs, args, args.sdpo_is_clip, dapo_loss(inputs, args))


@register_loss(
    "opsd",
    objective="opsd",
    printed="OPSD",
    dual_clip=True,
    self_teacher=True,
    needs=Needs(trains_zero_advantage=True),
)
def opsd_loss(inputs: LossInputs, args: Any) -> LossOutput:
    """GRPO's objective plus OPSD's generalized JSD (``opsd_beta``) between the frozen self-teacher's top-k (plus a
    tail bucket) and the student's distribution at every position of the rollouts with a self-teacher, weight
    ``self_distill_weight``, over the update's token count; logs the mean divergence (``self_distill/jsd``) and the
    share of loss tokens the term reached (``self_distill/tokens``)."""
    out = dapo_loss(inputs, args)
    if inputs.distill is None or inputs.teacher_mask is None:  # a batch ZPPO did not build (TRL's evaluation)
        return out
    mask = inputs.mask * inputs.teacher_mask
    total = chunked_jsd(inputs.distill, mask, args.opsd_beta, args.distill_chunk_size)
    out.loss = out.loss + args.self_distill_weight * total / inputs.normalizer
    count = mask.sum().to(torch.float64)
    out.means["self_distill/jsd"] = (total.detach().to(torch.float64), count)
    out.means["self_distill/tokens"] = (count, inputs.mask.sum().to(torch.float64))
    return out
