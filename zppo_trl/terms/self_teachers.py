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

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..batches import (
    SELF_TEACHER_LOGPS,
    SELF_TEACHER_MASK,
    SELF_TEACHER_TOPK_IDS,
    SELF_TEACHER_TOPK_LOGPS,
    TOKEN_TYPE_FIELDS,
    concat_batches,
    select_rows,
)
from ..checks import check_integer, check_number, check_positive
from ..distill import DistillInputs, TeacherTopK, chosen_token_logps, chunked_jsd, completion_states, top_k_logps
from ..losses import LossInputs, LossOutput, _old_logps, dapo_loss, register_loss
from ..needs import COPY_EMA, COPY_FROZEN, Needs
from ..prompts import compose_prompt
from ..rollout import CORRECT, FILLER
from ..teacher import strip_thinking
from .base import Contribution, Description, PlainStep, Term, TermContext, teacher_references

__all__ = [
    "OPSD",
    "OPSD_BETA",
    "OPSD_TOP_K",
    "SDPO",
    "SDPO_IS_CLIP",
    "SDPO_REPROMPT",
    "SDPO_SOLUTION",
    "SDPO_TEACHER_UPDATE_RATE",
    "SELF_TEACHERS",
    "SELF_TEACHER_NAME",
    "SelfTeacherSettings",
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


def sdpo_loss(inputs: LossInputs, args: Any) -> LossOutput:
    """GRPO's objective plus SDPO's sampled-token self-distillation to the EMA self-teacher, its importance ratio
    capped at ``sdpo_is_clip``."""
    return _self_distillation_term(inputs, args, args.sdpo_is_clip, dapo_loss(inputs, args))


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


# ---------------------------------------------------------------------- the terms

SELF_TEACHER_NAME = "self_teacher.pt"  # SDPO's / OPSD's self-teacher in a checkpoint


@dataclass(kw_only=True)  # after GRPOConfig's positional output_dir in ZPPOConfig
class SelfTeacherSettings:
    """SDPO's and OPSD's fields of :class:`zppo_trl.ZPPOConfig` (their official defaults)."""

    self_distill_weight: float = field(
        default=1.0,
        metadata={
            "help": "SDPO, OPSD: the weight of the self-distillation term added to GRPO's objective. Only "
            "policy_objective: sdpo|opsd reads it."
        },
    )
    sdpo_teacher_update_rate: float = field(
        default=SDPO_TEACHER_UPDATE_RATE,
        metadata={
            "help": "SDPO: the self-teacher (a copy of the initial student) moves this fraction of the way to the "
            "student after every optimizer step (its official 0.05; 0: the initial student, frozen). Only "
            "policy_objective: sdpo reads it."
        },
    )
    sdpo_is_clip: float = field(
        default=SDPO_IS_CLIP,
        metadata={
            "help": "SDPO: the cap on the stop-gradient importance ratio pi / pi_old weighting the term (its "
            "official 2). Only policy_objective: sdpo reads it."
        },
    )
    opsd_beta: float = field(
        default=OPSD_BETA,
        metadata={
            "help": "OPSD: beta of GKD's generalized JSD between the self-teacher and the student (0.5, OPSD's first "
            "version; 0 is KL(teacher || student), its later forward KL). Only policy_objective: opsd reads it."
        },
    )
    opsd_top_k: int = field(
        default=OPSD_TOP_K,
        metadata={
            "help": "OPSD: the self-teacher's top-k tokens per position kept for the divergence (plus one bucket for "
            "the rest of the vocabulary). Only policy_objective: opsd reads it."
        },
    )


class _SelfTeacherTerm(Term):
    """A self-teacher row (GRPO† with its term, on the plain rollouts): the copy of the student, its privileged
    context per rollout, its signal on the plain batch (:meth:`after_plain`) and what the loss reads of it."""

    selector = "policy_objective"
    settings = SelfTeacherSettings

    @classmethod
    def check_settings(cls, args: Any) -> None:
        check_number("self_distill_weight", args.self_distill_weight)
        check_number("sdpo_teacher_update_rate", args.sdpo_teacher_update_rate, high=1.0)
        check_number("opsd_beta", args.opsd_beta, high=1.0)
        check_integer("opsd_top_k", args.opsd_top_k, 1)
        check_positive("sdpo_is_clip", args.sdpo_is_clip)

    @classmethod
    def validate(cls, args: Any) -> None:
        if cls.needs.teacher_samples and not (args.teacher_base_url and args.teacher_model):
            raise ValueError(
                f"policy_objective={cls.name!r} shows the self-teacher the teacher's graded-correct reply: set "
                "teacher_base_url and teacher_model"
            )

    def __init__(self, args: Any, ctx: TermContext):
        super().__init__(args, ctx)
        self.spec = SELF_TEACHERS[self.name]
        decay = 1.0 - args.sdpo_teacher_update_rate if self.spec.moves else 1.0
        # SDPO's an EMA of the initial student moved every update, OPSD's the initial student, frozen
        self.copy = ctx.student_copy(decay, 1, f"policy_objective={self.name!r}")

    @property
    def copies(self) -> list[tuple[str, Any, str]]:
        return [(SELF_TEACHER_NAME, self.copy, "the self-teacher")]

    def contexts(self, step: PlainStep) -> list[str | None]:
        """The privileged prompt of each of this rank's rollouts (None: none)."""
        raise NotImplementedError

    def after_plain(self, step: PlainStep) -> Contribution:
        """The self-teacher's signal on this rank's rows: each rollout's privileged prompt (:meth:`contexts`), the
        self-teacher's signal under it, and ``self_teacher_mask`` 1 on the rollouts that have one. A rollout without
        a privileged prompt, and fillers, get none (counted)."""
        ctx, plain = self.ctx, step.draw.plain
        G = ctx.group_size
        contexts = self.contexts(step)
        rows = [i for i, context in enumerate(contexts) if context is not None]
        real = sum(G for group in plain if group.kind != FILLER)
        conversations = [ctx.teacher_chat(plain[i // G].row, contexts[i]) for i in rows]
        batch = step.round.batch
        mask = torch.zeros_like(batch["completion_mask"])
        metrics: dict[str, float] = {}
        t0 = time.perf_counter()
        fields = self.signal(batch, rows, conversations)
        if rows:
            mask[rows] = batch["completion_mask"][rows]
            metrics["time/self_teacher_s"] = time.perf_counter() - t0
        fields[SELF_TEACHER_MASK] = mask
        metrics["self_distill_rollouts"] = ctx.ranks.total(len(rows))
        metrics["self_distill_without_teacher"] = ctx.ranks.total(real - len(rows))
        return Contribution(fields=fields, metrics=metrics)

    def signal(self, batch: dict, rows: list[int], conversations: list) -> dict[str, torch.Tensor]:
        """The self-teacher's signal on ``batch``'s ``rows`` under their ``conversations``, as full-batch fields
        (zero on the other rows): SDPO's log-prob of each sampled token at the sampling temperature
        (``self_teacher_logps``), or OPSD's top ``opsd_top_k`` log-probs and ids at each position
        (``self_teacher_topk_*``, the raw distribution as the distillation rows' teacher)."""
        ids = batch["completion_ids"]
        vocab, chunk = len(self.ctx.tokenizer), self.args.distill_chunk_size
        if self.spec.signal == "token_logps":
            logps = torch.zeros(ids.shape, device=ids.device)
            temperature = self.ctx.temperature

            def score(states, head, sub):
                scaled = lambda hidden: head(hidden) / temperature  # noqa: E731  (as the student's log-probs)
                return chosen_token_logps(states, scaled, vocab, sub["completion_ids"], chunk)

            if rows:
                logps[rows] = torch.cat(self.under_prompts(batch, rows, conversations, score))
            return {SELF_TEACHER_LOGPS: logps}
        k = self.args.opsd_top_k
        top_ids = torch.zeros((*ids.shape, k), dtype=torch.long, device=ids.device)
        top_logps = torch.zeros((*ids.shape, k), device=ids.device)
        if rows:
            parts = self.under_prompts(
                batch, rows, conversations, lambda states, head, _sub: top_k_logps(states, head, vocab, k, chunk)
            )
            top_ids[rows] = torch.cat([part.ids for part in parts])
            top_logps[rows] = torch.cat([part.logps for part in parts])
        return {SELF_TEACHER_TOPK_IDS: top_ids, SELF_TEACHER_TOPK_LOGPS: top_logps}

    def under_prompts(self, batch: dict, rows: list[int], conversations: list, score: Callable) -> list:
        """``score(states, head, sub)`` of the self-teacher on ``batch``'s ``rows``, each teacher-forced after its
        own prompt ``conversations[k]`` in place of the one it was sampled from (same images),
        ``per_device_train_batch_size`` rows per forward (``sub``), no gradient; one result per forward."""
        ctx = self.ctx
        prompt_ids = ctx.tokenize_prompts(conversations)
        pad_id, vocab, size = ctx.tokenizer.pad_token_id, len(ctx.tokenizer), self.args.per_device_train_batch_size
        per_row = concat_batches([batch], pad_id)  # images split per row, for select_rows
        device = batch["completion_ids"].device
        out = []
        with torch.no_grad(), ctx.autocast():
            for start in range(0, len(rows), size):
                sub = select_rows(per_row, rows[start : start + size], trim=False)
                ids = [torch.tensor(p, device=device) for p in prompt_ids[start : start + size]]
                sub["prompt_ids"] = torch.nn.utils.rnn.pad_sequence(
                    ids, batch_first=True, padding_value=pad_id, padding_side="left"
                )
                sub["prompt_mask"] = torch.nn.utils.rnn.pad_sequence(
                    [torch.ones_like(i) for i in ids], batch_first=True, padding_value=0, padding_side="left"
                )
                for name in TOKEN_TYPE_FIELDS:  # the new prompt's image placeholders
                    if name in sub:
                        sub[name] = ctx.token_types(torch.cat([sub["prompt_ids"], sub["completion_ids"]], dim=1))
                states, head = completion_states(self.copy.model, sub, vocab)
                out.append(score(states, head, sub))
        return out

    def prepare_loss(self, model: Any, inputs: Any, loss_inputs: Any) -> None:
        """What the term reads of a micro-batch, onto ``loss_inputs``: its mask, and SDPO's log-probs of the sampled
        tokens, or OPSD's top-k with the student's completion states (a second student forward, with gradient, for
        the divergence). Nothing on a batch ZPPO did not build (TRL's evaluation)."""
        loss_inputs.teacher_mask = inputs.get(SELF_TEACHER_MASK)
        if loss_inputs.teacher_mask is None:
            return
        if self.spec.signal == "token_logps":
            loss_inputs.teacher_logps = inputs[SELF_TEACHER_LOGPS]
            return
        vocab = len(self.ctx.tokenizer)
        with self.ctx.autocast():
            states, head = completion_states(model, inputs, vocab, fused=self.args.fused_lm_head)
        topk = TeacherTopK(inputs[SELF_TEACHER_TOPK_IDS], inputs[SELF_TEACHER_TOPK_LOGPS])
        loss_inputs.distill = DistillInputs(states, head, vocab, topk=topk)


class SDPO(_SelfTeacherTerm):
    """SDPO† (``policy_objective: sdpo``): each rollout distilled towards an EMA copy of the student shown a correct
    sibling rollout."""

    name = "sdpo"
    printed = "SDPO"
    needs = Needs(student_copies=frozenset({(SELF_TEACHER_NAME, COPY_EMA)}), plain_pipeline_only=True)
    reads = ("self_distill_weight", "sdpo_teacher_update_rate", "sdpo_is_clip", "distill_chunk_size")

    @classmethod
    def describe(cls, args: Any) -> Description:
        return Description(
            plan=(
                f"  self-teacher (SDPO): an EMA copy of the student on every rank, shown a correct sibling rollout "
                f"(rate {args.sdpo_teacher_update_rate:g} per update; term weight {args.self_distill_weight:g}; a "
                "second set of weights: ZeRO-2 or DDP, not FSDP/ZeRO-3)",
            ),
            card=(
                "Each rollout is distilled towards an EMA copy of the student shown a correct sibling rollout "
                f"(SDPO's self-teacher; term weight {args.self_distill_weight:g})."
            ),
        )

    def contexts(self, step: PlainStep) -> list[str | None]:
        """SDPO's privileged prompt per rollout of this rank: its plain prompt and its group's first other correct
        rollout (:func:`sdpo_context`); None without one, and for fillers."""
        ctx, plain, plain_round = self.ctx, step.draw.plain, step.round
        G = ctx.group_size
        rank_rewards = plain_round.rewards.view(ctx.ranks.world, -1)[ctx.ranks.rank].tolist()
        correct = [reward > CORRECT and plain[i // G].kind != FILLER for i, reward in enumerate(rank_rewards)]
        contexts: list[str | None] = []
        for i, demonstration in enumerate(sdpo_demonstrations(correct, G)):
            group = plain[i // G]
            if group.kind == FILLER or demonstration is None:
                contexts.append(None)
                continue
            prompt = compose_prompt(self.ctx.question(group.row), group.block, self.args.closer)
            contexts.append(sdpo_context(prompt, plain_round.texts[demonstration]))
        return contexts


class OPSD(_SelfTeacherTerm):
    """OPSD† (``policy_objective: opsd``): each rollout distilled towards the initial student, frozen, shown the
    teacher's graded-correct reply."""

    name = "opsd"
    printed = "OPSD"
    needs = Needs(
        teacher_samples=True, student_copies=frozenset({(SELF_TEACHER_NAME, COPY_FROZEN)}), plain_pipeline_only=True
    )
    reads = ("self_distill_weight", "opsd_beta", "opsd_top_k", "distill_chunk_size")

    @classmethod
    def describe(cls, args: Any) -> Description:
        return Description(
            plan=(
                "  self-teacher (OPSD): the initial student, frozen, on every rank, shown the teacher's "
                f"graded-correct reply (JSD beta={args.opsd_beta:g} over its top {args.opsd_top_k}; term weight "
                f"{args.self_distill_weight:g}; a second set of weights: ZeRO-2 or DDP, not FSDP/ZeRO-3)",
            ),
            card=(
                "Each rollout is distilled towards the initial student, frozen, shown the teacher's graded-correct "
                f"reply (OPSD's self-teacher; term weight {args.self_distill_weight:g})."
            ),
            teacher_use=("a question's first graded-correct answer is shown to the self-teacher",),
        )

    def contexts(self, step: PlainStep) -> list[str | None]:
        """OPSD's privileged prompt per rollout of this rank: its question with the teacher's first graded-correct
        reply to it (:func:`opsd_context`), the same for the group's G rollouts; None where no reply was graded
        correct (``opsd_questions_without_reference``, over ranks), and for fillers."""
        ctx, plain = self.ctx, step.draw.plain
        G = ctx.group_size
        real = [group for group in plain if group.kind != FILLER]  # in the order the teacher was asked
        references = [
            reference if reference is not None and strip_thinking(reference).strip() else None
            for reference in teacher_references(ctx, step.teacher_future, real)
        ]
        contexts: list[str | None] = []
        for group, reference in zip(real, references):
            context = (
                None if reference is None else opsd_context(self.ctx.question(group.row), reference, self.args.closer)
            )
            contexts += [context] * G
        contexts += [None] * G * (len(plain) - len(real))  # fillers come last
        step.metrics["opsd_questions_without_reference"] = ctx.ranks.total(references.count(None))
        return contexts


# ---------------------------------------------------------------------- the objectives

# Each row is one policy objective: GRPO's plus its term, registered once, with the term that trains with it (whose
# needs and settings are the objective's). The term acts on rollouts of groups without a mixed reward too (an
# all-correct group's rollouts have siblings to learn from), so a partition with no advantage still trains.
register_loss(
    "sdpo", objective="sdpo", printed=SDPO.printed, dual_clip=True, needs=Needs(trains_zero_advantage=True), term=SDPO
)(sdpo_loss)
register_loss(
    "opsd", objective="opsd", printed=OPSD.printed, dual_clip=True, needs=Needs(trains_zero_advantage=True), term=OPSD
)(opsd_loss)
