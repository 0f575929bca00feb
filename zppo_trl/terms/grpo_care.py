"""GRPO-CARE's consistency bonus: the multimodal-reward row that rewards a correct answer the reasoning supports.

The paper's table of multimodal rewards adds GRPO-CARE (Chen et al. 2025, "GRPO-CARE: Consistency-Aware
Reinforcement Learning for Multimodal Reasoning", arXiv 2506.16141) to the GRPO† pipeline: "an adaptive
consistency bonus beside the correctness reward". As its official code computes it, per group of G rollouts of
one question:

1. A slowly moving reference, an exponential moving average of the student (``theta_ref <- d theta_ref +
   (1 - d) theta`` every ``k`` optimizer steps; d = 0.995, k = 10), scores each rollout: ``p_i`` is the geometric
   mean of its per-token probabilities over the answer given the question and the reasoning before it, capped at
   0.95 (here the answer is the content of the rollout's last ``\\boxed{}``; no answer: ``p_i = 1``, then capped).
2. The high-accuracy rollouts are ``S = {i : r_i > 0.1 and r_i >= mean_j r_j}``, r the correctness reward.
3. ``pbar`` is the mean of ``p`` over S; a rollout of S with ``p_i >= pbar - margin`` (margin 0) gets
   ``lambda r_i`` (lambda 0.5), and that bonus is added to its reward before the advantages.

So only correct rollouts ever get it, and of those the ones whose answer the reference finds at least as
consistent with their reasoning as their group's correct peers do. This module is pure: torch only.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..checks import check_integer, check_number
from ..distill import chosen_token_logps, completion_states
from ..needs import COPY_EMA, Needs
from ..rewards import boxed_spans
from ..rollout import FILLER
from ..student_copy import EMAReference
from .base import Contribution, Description, PlainStep, Term, TermContext, register_term

__all__ = [
    "CARE_BONUS",
    "CARE_CAP",
    "CARE_DECAY",
    "CARE_EVERY",
    "CARE_MARGIN",
    "CARE_REFERENCE_NAME",
    "CareSettings",
    "EMAReference",
    "GRPOCare",
    "answer_likelihood",
    "answer_token_span",
    "consistency_bonus",
]

# GRPO-CARE's defaults, as its official training scripts set them (bonus_coefficient, confidence_upper_bound,
# ref_ema_decay, ref_ema_update_every, consistency_margin).
CARE_BONUS = 0.5
CARE_CAP = 0.95
CARE_DECAY = 0.995
CARE_EVERY = 10
CARE_MARGIN = 0.0
# The correctness reward a rollout must exceed to count among the high-accuracy ones.
_HIGH_ACCURACY = 0.1


def consistency_bonus(
    rewards: Sequence[float],
    likelihoods: Sequence[float],
    group_ids: Sequence[Hashable],
    coefficient: float = CARE_BONUS,
    cap: float = CARE_CAP,
    margin: float = CARE_MARGIN,
) -> list[float]:
    """Each rollout's bonus: ``coefficient * r_i`` for a high-accuracy rollout (``r_i > 0.1`` and at least its
    group's mean reward) whose capped likelihood ``min(p_i, cap)`` is at least its group's mean over the
    high-accuracy rollouts minus ``margin``; 0 for every other rollout (and for every rollout of a group without a
    high-accuracy one)."""
    if not len(rewards) == len(likelihoods) == len(group_ids):
        raise ValueError(f"{len(rewards)} rewards, {len(likelihoods)} likelihoods and {len(group_ids)} group ids")
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    bonus = [0.0] * len(rewards)
    for rows in members.values():
        mean = sum(rewards[i] for i in rows) / len(rows)
        high = [i for i in rows if rewards[i] > _HIGH_ACCURACY and rewards[i] >= mean]
        if not high:
            continue
        capped = {i: min(float(likelihoods[i]), cap) for i in high}
        reference = sum(capped.values()) / len(high)
        for i in high:
            # A rollout level with the mean is at least the mean: the float mean of equal likelihoods can round above
            # them (three of 0.1 average to 0.10000000000000002), and identical rollouts then lost the bonus.
            if capped[i] >= reference - margin or math.isclose(capped[i], reference - margin, rel_tol=1e-9):
                bonus[i] = coefficient * float(rewards[i])
    return bonus


def answer_token_span(completion_ids: Sequence[int], tokenizer: Any) -> tuple[int, int]:
    """``[start, end)``, the completion tokens that hold the content of its last ``\\boxed{...}`` (the answer
    GRPO-CARE scores), found on the decoded text: ``start`` the last token that begins at or before the content,
    ``end`` the first prefix that covers it. ``(n, n)``, empty, when there is no closed box."""
    ids = list(completion_ids)
    n = len(ids)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    spans = boxed_spans(text)
    if not spans:
        return n, n
    box_start, box_end = spans[-1]
    begin, end = text.index("{", box_start) + 1, box_end - 1  # the content, between the braces

    def covered(k: int) -> int:  # characters the first k tokens decode to
        return len(tokenizer.decode(ids[:k], skip_special_tokens=False))

    lo, hi = 0, n  # the last k with covered(k) <= begin
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if covered(mid) <= begin else (lo, mid - 1)
    start = lo
    lo, hi = start, n  # the first k with covered(k) >= end
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if covered(mid) >= end else (mid + 1, hi)
    return start, max(lo, start)


def answer_likelihood(token_logps: torch.Tensor, span: tuple[int, int]) -> float:
    """The geometric mean of the per-token probabilities over ``span`` of one completion's ``token_logps``:
    ``exp(mean log p)``; 1.0 for an empty span (as GRPO-CARE's code, before its cap)."""
    start, end = span
    if end <= start:
        return 1.0
    return float(torch.exp(token_logps[start:end].double().mean()))


# ---------------------------------------------------------------------- the term

CARE_REFERENCE_NAME = "care_reference.pt"  # GRPO-CARE's EMA weights in a checkpoint


@dataclass(kw_only=True)  # after GRPOConfig's positional output_dir in ZPPOConfig
class CareSettings:
    """GRPO-CARE's fields of :class:`zppo_trl.ZPPOConfig` (``reward_term: grpo_care`` reads them)."""

    care_bonus_coefficient: float = field(
        default=CARE_BONUS,
        metadata={"help": "GRPO-CARE: the bonus is this times the correctness reward. Only reward_term reads it."},
    )
    care_ema_decay: float = field(
        default=CARE_DECAY,
        metadata={"help": "GRPO-CARE: the reference's EMA decay. Only reward_term: grpo_care reads it."},
    )
    care_ema_every: int = field(
        default=CARE_EVERY,
        metadata={"help": "GRPO-CARE: optimizer steps between EMA updates. Only reward_term: grpo_care reads it."},
    )
    care_margin: float = field(
        default=CARE_MARGIN,
        metadata={
            "help": "GRPO-CARE: how far below its group's mean likelihood a correct rollout may be and still get the "
            "bonus (its code: 0, or 0.01 for transfer to general video benchmarks). Only reward_term reads it."
        },
    )


@register_term
class GRPOCare(Term):
    """GRPO-CARE† (``reward_term: grpo_care``): the consistency bonus added to the plain rewards for the advantages
    (never the plain accuracy or the buffer), from an EMA reference copy of the student."""

    selector = "reward_term"
    name = "grpo_care"
    printed = "GRPO-CARE"
    needs = Needs(student_copies=frozenset({(CARE_REFERENCE_NAME, COPY_EMA)}), plain_pipeline_only=True)
    settings = CareSettings
    reads = ("care_bonus_coefficient", "care_ema_decay", "care_ema_every", "care_margin", "distill_chunk_size")

    @classmethod
    def check_settings(cls, args: Any) -> None:
        for name in ("care_bonus_coefficient", "care_margin"):
            check_number(name, getattr(args, name))
        check_number("care_ema_decay", args.care_ema_decay, high=1.0)
        check_integer("care_ema_every", args.care_ema_every, 1)

    @classmethod
    def describe(cls, args: Any) -> Description:
        return Description(
            plan=(
                f"  reward term: GRPO-CARE's consistency bonus ({args.care_bonus_coefficient:g} x reward), from an "
                f"EMA copy of the student on every rank (decay {args.care_ema_decay:g} every {args.care_ema_every} "
                "updates; a second set of weights: ZeRO-2 or DDP, not FSDP/ZeRO-3)",
            ),
            card=(
                f"Correct rollouts whose answer an EMA copy of the student finds most likely gain GRPO-CARE's "
                f"consistency bonus ({args.care_bonus_coefficient:g} x reward) in the advantages only."
            ),
        )

    def __init__(self, args: Any, ctx: TermContext):
        super().__init__(args, ctx)
        self.reference = ctx.student_copy(args.care_ema_decay, args.care_ema_every, "reward_term='grpo_care'")

    @property
    def copies(self) -> list[tuple[str, Any, str]]:
        return [(CARE_REFERENCE_NAME, self.reference, "GRPO-CARE's reference")]

    def after_plain(self, step: PlainStep) -> Contribution:
        """The bonus of every rank's rollouts (:func:`consistency_bonus`): the likelihoods of every rank's rollouts
        are gathered, and every rank computes every group's bonus alike. Fillers get none."""
        ctx, plain_round = self.ctx, step.round
        G, world = ctx.group_size, ctx.ranks.world
        likelihoods = [p for rank in ctx.ranks.gather(self.answer_likelihoods(plain_round.batch)) for p in rank]
        rewards = plain_round.rewards.view(world, -1)
        real = [
            (rank, g * G + i)
            for rank, groups in enumerate(plain_round.groups_per_rank)
            for g, (kind, _key) in enumerate(groups)
            if kind != FILLER
            for i in range(G)
        ]
        width = rewards.size(1)
        bonus = consistency_bonus(
            [float(rewards[rank, i]) for rank, i in real],
            [likelihoods[rank * width + i] for rank, i in real],
            [(rank, i // G) for rank, i in real],
            self.args.care_bonus_coefficient,
            CARE_CAP,
            self.args.care_margin,
        )
        added = torch.zeros_like(rewards)
        for (rank, i), extra in zip(real, bonus):
            added[rank, i] += extra
        metrics = {
            "care_bonused": sum(1 for extra in bonus if extra > 0),
            "care_likelihood_mean": sum(likelihoods[rank * width + i] for rank, i in real) / max(len(real), 1),
        }
        return Contribution(rewards=added.view(-1), metrics=metrics)

    def answer_likelihoods(self, batch: dict) -> list[float]:
        """GRPO-CARE's ``p`` of each of this rank's rollouts: the reference's geometric-mean probability of the
        answer's tokens given the question and the reasoning before them, its logits ``distill_chunk_size``
        positions at a time."""
        tokenizer = self.ctx.tokenizer
        vocab = len(tokenizer)
        with torch.no_grad(), self.ctx.autocast():
            states, head = completion_states(self.reference.model, batch, vocab)
            logps = chosen_token_logps(states, head, vocab, batch["completion_ids"], self.args.distill_chunk_size)
        likelihoods = []
        for r in range(batch["completion_ids"].size(0)):
            length = int(batch["completion_mask"][r].sum())
            span = answer_token_span(batch["completion_ids"][r, :length].tolist(), tokenizer)
            likelihoods.append(answer_likelihood(logps[r, :length], span))
        return likelihoods
