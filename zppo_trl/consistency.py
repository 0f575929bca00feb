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

import copy
import math
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from .rewards import boxed_spans

__all__ = [
    "CARE_BONUS",
    "CARE_CAP",
    "CARE_DECAY",
    "CARE_EVERY",
    "CARE_MARGIN",
    "EMAReference",
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


class EMAReference:
    """GRPO-CARE's reference model: a frozen copy of the student, moved towards it every ``every`` optimizer steps
    by ``theta_ref <- decay theta_ref + (1 - decay) theta``."""

    def __init__(self, model: torch.nn.Module, decay: float = CARE_DECAY, every: int = CARE_EVERY):
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        # The student's forward may be patched per instance (TRL's fused LM head, zppo_trl.lm_head), by closures over
        # the student itself: a deep copy would keep calling the student's weights. The class's forward is the copy's.
        vars(self.model).pop("forward", None)
        self.decay, self.every = decay, every

    @torch.no_grad()
    def after_step(self, model: torch.nn.Module, step: int) -> bool:
        """Move towards ``model`` when ``step`` (optimizer steps taken) is a multiple of ``every``; whether it
        moved."""
        if step <= 0 or step % self.every:
            return False
        for ema, live in zip(self.model.parameters(), model.parameters(), strict=True):
            ema.lerp_(live.detach().to(ema.dtype), 1.0 - self.decay)
        return True

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)
