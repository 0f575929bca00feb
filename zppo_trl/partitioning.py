"""Algorithm 1, step 6's first half: a rollout step's rows dealt, groups intact, into optimizer mini-batches.

One partitioner serves every row of the paper:

* RL rows (ZPPO, GRPO, GRPO†, Hint, Prefix, the objective variants): every group (plain, replayed,
  BCQ/NCQ, ...) goes whole into one of ``num_partitions`` partitions, each kind spread evenly; the
  partition's advantages are two-step over its complete groups (:mod:`zppo_trl.advantages`).
* Target rows (Correction-/Error-reflection-SFT, Off-/On-Distill): the step's questions are dealt
  into the partitions (new and replayed evenly) and each target trains in its question's partition.

Under a term's partition signal (``signal``: the zero-variance terms of :mod:`zppo_trl.terms`) the rows it marks (the
all-wrong groups') carry the signal, so a partition holding one has something to learn from. Teacher-forced target rows
of a term join the RL rows: each target row goes into the partition of its question's plain group, with zero
advantage and its own mark, and makes that partition one with something to learn from. Under an objective that
trains zero advantages (``dense``: KDRL's reverse KL acts on every rollout) every partition has something to learn
from.

Either way a partition in which no rank has anything to learn from makes no optimizer update at all:
its micro-batches are :data:`SKIP` markers, which the trainer turns into steps without a forward or a
backward. Every rank packs its share of a partition into the same number of micro-batches, padded
with zero-weight rows, so all ranks step alike.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .advantages import nontrivial_groups, partition_groups, two_step_advantages
from .batches import MARKED_ROWS, ROUND_ROW, TARGET_ROWS, select_rows
from .rollout import FILLER

__all__ = [
    "SKIP",
    "PolicyPartitions",
    "deal_targets",
    "generated_tokens",
    "is_skipped",
    "pack_partition",
    "policy_partitions",
    "skipped",
]

SKIP = "zppo_skip"  # marks the micro-batches of a partition that makes no update


def _no_signal(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """No partition signal over ``n`` rows: nothing marked, no extra advantage."""
    return torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.float64)


def skipped(grad_accum: int) -> list[dict]:
    """The micro-batches of a partition that makes no optimizer update."""
    return [{SKIP: True}] * grad_accum


def is_skipped(micro_batch: Mapping) -> bool:
    return bool(micro_batch.get(SKIP))


def pack_partition(
    batch: dict,
    local: Sequence[int],
    largest: int,
    advantages: Sequence[float],
    tokens: float,
    sequences: float,
    grad_accum: int,
    num_partitions: int,
    device: Any,
    marks: Sequence[bool] | None = None,
    targets: Sequence[bool] | None = None,
) -> list[dict]:
    """One optimizer update's ``grad_accum`` micro-batches of this rank's rows ``local``.

    Rows are padded with zero-weight copies to ``largest`` (the largest rank's row count, rounded up to a
    multiple of ``grad_accum``) so every rank steps alike. ``tokens`` is the partition's loss-token count
    over all ranks: TRL's DAPO loss divides by ``num_items_in_batch / processes * grad_accum /
    steps_per_generation``, so carrying ``tokens * num_partitions`` there makes the divisor the partition's
    own token count, a token mean per optimizer update. ``marks`` (one per row of ``local``) flags the rows of
    all-wrong groups for a loss-time zero-variance signal (``zero_variance_rows``; padding rows unmarked), and
    ``targets`` ReLIFT's teacher-target rows (``teacher_target_rows``).
    ``sequences`` (the partition's responses with a loss
    token, over all ranks) travels the same way as ``num_sequences_in_batch``: the divisor of the losses that
    average per response (GSPO as its paper aggregates).
    """
    local = list(local)
    size = max(grad_accum, math.ceil(largest / grad_accum) * grad_accum)
    index = local + [local[0] if local else 0] * (size - len(local))
    advantages = list(advantages) + [0.0] * (size - len(local))
    flags = {
        field: [float(m) for m in values] + [0.0] * (size - len(local))
        for field, values in ((MARKED_ROWS, marks), (TARGET_ROWS, targets))
        if values is not None
    }
    items = torch.tensor(tokens * num_partitions, device=device)
    responses = torch.tensor(sequences * num_partitions, device=device)
    per_micro = size // grad_accum
    micro_batches = []
    for m in range(grad_accum):
        lo, hi = m * per_micro, (m + 1) * per_micro
        micro = select_rows(batch, index[lo:hi])
        micro[ROUND_ROW] = torch.tensor(index[lo:hi])
        micro["advantages"] = torch.tensor(advantages[lo:hi], device=micro["advantages"].device)
        for field, values in flags.items():
            micro[field] = torch.tensor(values[lo:hi], device=micro["advantages"].device)
        padding = [j - lo for j in range(max(lo, len(local)), hi)]
        if padding:  # zero-weight padding rows: no loss tokens
            micro["completion_mask"][padding] = 0
        micro["num_items_in_batch"] = items
        micro["num_sequences_in_batch"] = responses
        micro_batches.append(micro)
    return micro_batches


def _loss_mask(batch: Mapping) -> torch.Tensor:
    return batch["completion_mask"] * batch["tool_mask"] if "tool_mask" in batch else batch["completion_mask"]


@dataclass
class PolicyPartitions:
    """The RL rows' partitions: this rank's micro-batches, the number of partitions that make no update, and
    the advantage of every trained rollout over all ranks, keyed by ``(rank, row)``."""

    micro_batches: list[dict]
    skipped: int
    trained: dict[tuple[int, int], float]
    trained_tokens: int = 0  # loss tokens of the partitions that made an update, over all ranks


def policy_partitions(
    batch: dict,
    kinds_per_rank: Sequence[Sequence[str]],
    rewards_per_rank: Sequence[Sequence[float]],
    group_size: int,
    args: Any,
    ranks: Any,
    seed: int,
    confidences_per_rank: Sequence[Sequence[float]] | None = None,
    targets_per_rank: Sequence[Sequence[tuple[int, tuple[int, int]]]] | None = None,
    *,
    signal: Callable | None = None,
    dense: bool = False,
) -> PolicyPartitions:
    """Deal every rank's groups (``kinds_per_rank[r]``: the kind of each group of rank ``r``, in row order;
    ``rewards_per_rank[r]``: its rows' rewards) into ``args.num_partitions`` partitions, compute two-step
    advantages per partition, add the zero-variance signal of ``args.zero_variance_signal`` (LENS reads
    ``confidences_per_rank[r]``, each row's mean sampling log-prob), and pack this rank's share. Fillers are
    never trained. ``targets_per_rank[r]`` lists rank ``r``'s teacher-target rows (ReLIFT) as ``(row, (rank,
    group))``: the row joins the partition of that plain group, with zero advantage."""
    partitions, grad_accum = args.num_partitions, args.gradient_accumulation_steps
    # rows[r][p]: rank r's row indices in partition p; rewards and group ids keyed by (rank, row)
    rows: list[list[list[int]]] = []
    reward_of: dict[tuple[int, int], float] = {}
    group_of: dict[tuple[int, int], tuple[int, int]] = {}
    for r, kinds in enumerate(kinds_per_rank):
        real, ids, strata = [], [], []
        for g, kind in enumerate(kinds):
            for i in range(g * group_size, (g + 1) * group_size):
                reward_of[(r, i)], group_of[(r, i)] = rewards_per_rank[r][i], (r, g)
                if kind != FILLER:
                    real.append(i)
                    ids.append(g)
                    strata.append(kind)
        split = partition_groups(ids, partitions, rng=random.Random(seed + r), strata=strata)
        rows.append([[real[j] for j in part] for part in split])
    target_rows: list[list[set[int]]] = [[set() for _ in range(partitions)] for _ in kinds_per_rank]
    if targets_per_rank:
        partition_of = {
            group_of[(r, i)]: p for r, parts in enumerate(rows) for p, part in enumerate(parts) for i in part
        }
        for r, targets in enumerate(targets_per_rank):
            for row, anchor in targets:
                rows[r][partition_of[anchor]].append(row)
                target_rows[r][partition_of[anchor]].add(row)

    # dense (KDRL's): every rollout carries a signal, even at advantage 0, so no partition is skipped for want of one
    loss_mask = _loss_mask(batch)
    device = ranks.accelerator.device
    mine = [loss_mask[rows[ranks.rank][p]] for p in range(partitions)]
    local_counts = torch.tensor([[float(m.sum()), float((m.sum(-1) > 0).sum())] for m in mine], device=device)
    tokens, sequences = ranks.reduce_sum(local_counts).T.tolist()

    micro_batches: list[dict] = []
    skipped_count = trained_tokens = 0
    trained: dict[tuple[int, int], float] = {}
    for p in range(partitions):
        members = [(r, i) for r in range(ranks.world) for i in rows[r][p] if i not in target_rows[r][p]]
        has_targets = any(target_rows[r][p] for r in range(ranks.world))
        rewards = [reward_of[m] for m in members]
        group_ids = [group_of[m] for m in members]
        confidences = [confidences_per_rank[r][i] for r, i in members] if confidences_per_rank else None
        found = signal(rewards, group_ids, confidences) if signal is not None else None
        marked, extra = found if found is not None else _no_signal(len(members))
        if not (has_targets or (members and (dense or nontrivial_groups(rewards, group_ids) or marked.any()))):
            skipped_count += 1
            micro_batches += skipped(grad_accum)
            continue
        adv = (
            two_step_advantages(rewards, group_ids, args.advantage_normalization, args.advantage_epsilon)
            if members
            else torch.zeros(0)
        )
        adv = (adv.double() + extra).float()  # the signal lands on the all-wrong rows, whose two-step value is 0
        advantage_of = dict(zip(members, adv.tolist()))
        mark_of = dict(zip(members, marked.tolist()))
        trained.update(advantage_of)
        trained_tokens += int(tokens[p])
        local = rows[ranks.rank][p]
        largest = max(len(rows[r][p]) for r in range(ranks.world))
        advantages = [advantage_of.get((ranks.rank, i), 0.0) for i in local]  # a target row: zero
        marks = [mark_of.get((ranks.rank, i), False) for i in local] if marked.any() else None
        targets = [i in target_rows[ranks.rank][p] for i in local] if has_targets else None
        micro_batches += pack_partition(
            batch, local, largest, advantages, tokens[p], sequences[p], grad_accum, partitions, device, marks, targets
        )
    return PolicyPartitions(micro_batches, skipped_count, trained, trained_tokens)


def generated_tokens(batch: Mapping, kinds: Sequence[str], group_size: int) -> int:
    """The response tokens of this rank's sampled rows in ``batch`` (groups of ``group_size`` rows in order, each
    of the kind in ``kinds``), fillers left out."""
    if not kinds:
        return 0
    real = torch.tensor([kind != FILLER for kind in kinds], dtype=torch.bool).repeat_interleave(group_size)
    mask = batch["completion_mask"][: real.numel()]  # rows after the groups' (ReLIFT's targets) were not sampled
    return int(mask[real.to(mask.device)].sum())


def deal_targets(
    batch: dict | None,
    keys_per_rank: Sequence[Sequence[tuple[str, Any]]],
    new_keys: Sequence[Any],
    replay_keys: Sequence[Any],
    args: Any,
    ranks: Any,
    seed: int,
) -> tuple[list[dict], int, int]:
    """The target rows' partitions: the step's questions dealt into ``args.num_partitions`` (new and replayed
    evenly, as the RL rows are); each target row (``keys_per_rank[r]``: ``(kind, key)`` per row of rank ``r``)
    trains in its question's partition, with zero advantage (the losses read only the tokens). Returns this
    rank's micro-batches, the number of partitions without any target, and the target rows trained."""
    grad_accum = args.gradient_accumulation_steps
    keys = [*new_keys, *replay_keys]
    strata = ["new"] * len(new_keys) + ["replay"] * len(replay_keys)
    split = partition_groups(list(range(len(keys))), args.num_partitions, rng=random.Random(seed), strata=strata)
    partition_of = {keys[i]: p for p, part in enumerate(split) for i in part}
    members = [
        [
            [i for i, (kind, key) in enumerate(keys_per_rank[r]) if kind != FILLER and partition_of.get(key) == p]
            for r in range(ranks.world)
        ]
        for p in range(len(split))
    ]
    micro_batches: list[dict] = []
    trained = skipped_count = 0
    for rows in members:
        if not any(rows):
            skipped_count += 1
            micro_batches += skipped(grad_accum)
            continue
        local = rows[ranks.rank]
        mask = batch["completion_mask"][local]
        counts = torch.tensor([float(mask.sum()), float((mask.sum(-1) > 0).sum())], device=ranks.accelerator.device)
        tokens, sequences = ranks.reduce_sum(counts).tolist()
        largest = max(len(m) for m in rows)
        micro_batches += pack_partition(
            batch,
            local,
            largest,
            [0.0] * len(local),
            tokens,
            sequences,
            grad_accum,
            args.num_partitions,
            ranks.accelerator.device,
        )
        trained += sum(len(m) for m in rows)
    return micro_batches, skipped_count, trained
