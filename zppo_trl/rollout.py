"""The values one rollout step passes between its stages: groups to sample, generation rounds, the draw.

A *group* is one prompt sampled ``num_generations`` times. A *round* is one call into TRL's
generation and scoring over this rank's groups; the trainer runs a plain round (Algorithm 1, step 3)
and, when an augmentation built prompts, an augmented round (step 5). The supervised controls and
Off-Distill run a *target round* instead: given responses teacher-forced through the same scoring.

:class:`RoundRequest` is what a round asks of TRL's generation hooks (response prefixes, given
responses) and where the scoring hook leaves what the step reads back (rewards, texts): one value,
live only for the duration of that round's call into TRL, in place of loose trainer attributes.

This module is pure: it imports neither TRL nor the trainer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import data

__all__ = [
    "CORRECT",
    "FILLER",
    "Draw",
    "Group",
    "Round",
    "RoundRequest",
    "draw_questions",
    "empty_round",
    "merge_lists",
    "plain_accuracy",
]

FILLER = "filler"  # a group generated only to keep ranks' row counts equal: never trained, never counted
CORRECT = 0.5  # rewards are binary accuracies; a rollout is correct above this


@dataclass(frozen=True)
class Group:
    """One group to sample on this rank: its kind, dataset row, prompt block (None: the plain prompt) and
    the response prefix its rollouts continue (token ids; the Prefix control only)."""

    kind: str
    row: Mapping
    block: str | None = None
    response_prefix: tuple[int, ...] | None = None


@dataclass
class RoundRequest:
    """What one generation round asks of TRL's hooks, and what its scoring hook hands back.

    ``response_prefixes``: per rollout row, token ids that end its generation prompt (Prefix), or None.
    ``given_responses``: per row, the token ids to teacher-force instead of sampling (target rounds).
    ``old_logps``: whether TRL's scoring computes the sampling policy's log-probs of every row (False: the
    trainer computes them later, for the micro-batches that read them; ``ZPPOConfig.defer_old_logps``).
    ``rewards`` / ``texts``: filled by the scoring hook: every rank's weighted rewards (gathered,
    rank-major; NaN where no reward function scored a rollout) and this rank's completion texts;
    ``rewards_per_func``: every rank's rewards per reward function (rollouts x functions; NaN: unscored).
    ``early``: where a pipelined second round's prompts went as they were built (:mod:`zppo_trl.early_rollouts`).
    """

    response_prefixes: list[tuple[int, ...] | None] | None = None
    given_responses: list[list[int]] | None = None
    old_logps: bool = True
    rewards: torch.Tensor | None = None
    texts: list[str] = field(default_factory=list)
    rewards_per_func: torch.Tensor | None = None
    # the zppo_trl.early_rollouts.EarlyBatch its prompts were sent through as they were built (None: TRL's generation)
    early: Any = None

    @property
    def has_prefixes(self) -> bool:
        return bool(self.response_prefixes) and any(self.response_prefixes)


@dataclass
class Round:
    """A finished round: TRL's scored batch (None when no rank had a group), every rank's rewards
    (rank-major; None for target rounds), this rank's completion texts, and every rank's
    ``(kind, key)`` per group (per row for target rounds), indexed by rank; a sampled round's rewards per
    reward function as TRL scored them (rollouts x functions, NaN where unscored)."""

    batch: dict | None
    rewards: torch.Tensor | None
    texts: list[str]
    groups_per_rank: list[list[tuple[str, Any]]]
    rewards_per_func: torch.Tensor | None = None


def empty_round(world: int) -> Round:
    """A round in which no rank had anything to generate."""
    return Round(None, None, [], [[] for _ in range(world)])


@dataclass
class Draw:
    """Algorithm 1, step 1: the step's new questions and replayed residents (keys, over all ranks), this
    rank's plain groups (its new questions, its share of the replay draw, then fillers) and the filler count."""

    new_keys: list
    replay_keys: list
    plain: list[Group]
    fillers: int


def draw_questions(
    batch: Sequence[Mapping],
    group_size: int,
    sample_replay: Callable[[int], list],
    ranks: Any,
    row_of: Callable[[Any], Mapping],
) -> Draw:
    """Step 1 from the dataloader's ``batch`` (each question repeated ``group_size`` times in a row);
    ``sample_replay(n)`` draws the replayed residents for ``n`` new questions over all ranks, and
    ``row_of(key)`` looks one up. Replay draws are dealt round-robin over ``ranks``; a rank short of one
    generates a filler group so that every rank scores equal row counts."""
    local_new = [batch[i] for i in range(0, len(batch), group_size)]
    for i, row in enumerate(local_new):
        if any(r[data.ID] != row[data.ID] for r in batch[i * group_size : (i + 1) * group_size]):
            raise RuntimeError("the dataloader must repeat each question num_generations times in a row")
    new_keys = [key for part in ranks.gather([r[data.ID] for r in local_new]) for key in part]
    replay_keys = sample_replay(len(new_keys))
    replay_share = ranks.share(replay_keys)
    fillers = ranks.shortfall(len(replay_keys))
    plain = [Group("new", row) for row in local_new]
    plain += [Group("replay", row_of(key)) for key in replay_share]
    plain += [Group(FILLER, local_new[0])] * fillers
    return Draw(new_keys, list(replay_keys), plain, fillers)


def plain_accuracy(
    groups_per_rank: Sequence[Sequence[tuple[str, Any]]], rewards: torch.Tensor, group_size: int, order: Sequence[Any]
) -> dict:
    """``{key: r_x}`` over the plain groups of all ranks, pooled per key, in ``order`` (new, then replay)."""
    sums: dict[Any, float] = defaultdict(float)
    counts: dict[Any, int] = defaultdict(int)
    offset = 0
    for groups in groups_per_rank:
        for kind, key in groups:
            if kind != FILLER:
                sums[key] += float(rewards[offset : offset + group_size].sum())
                counts[key] += group_size
            offset += group_size
    # a question whose only group left the step (a filler now: not scored) has no accuracy this step
    return {key: min(max(sums[key] / counts[key], 0.0), 1.0) for key in dict.fromkeys(order) if counts[key]}


def merge_lists(parts: Sequence[Mapping[Any, list]]) -> dict[Any, list]:
    """The per-key lists of every part concatenated, in part order (e.g. every rank's evidence)."""
    merged: dict[Any, list] = defaultdict(list)
    for part in parts:
        for key, values in part.items():
            merged[key].extend(values)
    return dict(merged)
