"""Two-step (REINFORCE++) advantages over one optimizer partition, and the partitioning.

Step 1 (eq. adv-step1) subtracts each group's own mean: ``A' = r - mean_g``.
Step 2 (eq. adv-step2) normalises across a sub-population S of the partition's groups:
``A = (A' - mu_S) / (sigma_S + eps)`` with population statistics over rollouts.

- ``"without_zero"`` (the paper's *Norm w/o Zero*, ZPPO default): S = non-trivial groups.
- ``"with_zero"``: S = all groups; the zeros of trivial groups shrink sigma by sqrt(f_nt).
- ``"none"``: Step 2 is skipped, ``A = A'``.

A trivial group (all rewards equal, std_g = 0) gets exactly 0 in every mode, and a
partition without a non-trivial group is an empty-signal partition: all zeros, and the
trainer skips its optimizer update.

This module is pure: no TRL, no trainer.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence

import torch

__all__ = ["NORMALIZATIONS", "nontrivial_groups", "partition_groups", "two_step_advantages"]

NORMALIZATIONS = ("without_zero", "with_zero", "none")


def _group_index(group_ids: Sequence[Hashable]) -> tuple[torch.Tensor, int]:
    """Dense group index per row (first-seen order) and the number of groups."""
    dense: dict[Hashable, int] = {}
    index = [dense.setdefault(g, len(dense)) for g in group_ids]
    return torch.tensor(index, dtype=torch.long), len(dense)


def _nontrivial(r: torch.Tensor, index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Per group: whether its rewards are not all equal (std_g > 0)."""
    lo = torch.full((num_groups,), float("inf"), dtype=r.dtype).scatter_reduce_(0, index, r, "amin")
    hi = torch.full((num_groups,), float("-inf"), dtype=r.dtype).scatter_reduce_(0, index, r, "amax")
    return hi > lo


def nontrivial_groups(rewards: Sequence[float] | torch.Tensor, group_ids: Sequence[Hashable]) -> set:
    """The ids of the groups whose rewards are not all equal (std_g > 0)."""
    index, num_groups = _group_index(group_ids)
    flags = _nontrivial(torch.as_tensor(rewards, dtype=torch.float64).flatten(), index, num_groups).tolist()
    return {g for g, flag in zip(dict.fromkeys(group_ids), flags) if flag}


def two_step_advantages(
    rewards: Sequence[float] | torch.Tensor,
    group_ids: Sequence[Hashable],
    normalization: str = "without_zero",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Per-rollout advantages for the complete groups of ONE optimizer partition.

    Args:
        rewards: one scalar reward per rollout.
        group_ids: the group (uid) of each rollout; every group must be complete here.
        normalization: ``"without_zero"`` (default), ``"with_zero"`` or ``"none"``.
        eps: the stabiliser added to sigma_S (distinct from the clip epsilons).

    Returns:
        A float tensor shaped like ``rewards`` (float32 unless rewards are float64).
        Each group's Step-1 values sum to zero; trivial groups are exactly 0.
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    r = torch.as_tensor(rewards)
    out_dtype = r.dtype if r.dtype == torch.float64 else torch.float32
    r = r.to(torch.float64).flatten()
    if r.numel() != len(group_ids):
        raise ValueError(f"{r.numel()} rewards but {len(group_ids)} group ids")
    if r.numel() == 0:
        return torch.zeros(0, dtype=out_dtype)
    if not torch.isfinite(r).all():
        raise ValueError("rewards must be finite")

    index, num_groups = _group_index(group_ids)
    sums = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, r)
    counts = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, torch.ones_like(r))
    nontrivial_row = _nontrivial(r, index, num_groups)[index]

    # Step 1; trivial groups are set to exactly 0 rather than r - mean (which can round).
    a1 = torch.where(nontrivial_row, r - (sums / counts)[index], torch.zeros_like(r))
    if normalization == "none":
        return a1.to(out_dtype)

    population = nontrivial_row if normalization == "without_zero" else torch.ones_like(nontrivial_row)
    if not nontrivial_row.any():
        return torch.zeros_like(r, dtype=out_dtype)  # empty-signal partition
    values = a1[population]
    mu = values.mean()
    sigma = values.std(correction=0)
    a2 = (a1 - mu) / (sigma + eps)
    return torch.where(nontrivial_row, a2, torch.zeros_like(a2)).to(out_dtype)


def partition_groups(
    group_ids: Sequence[Hashable],
    num_partitions: int,
    rng: random.Random | int | None = None,
    strata: Sequence[Hashable] | None = None,
) -> list[list[int]]:
    """Split rows into ``num_partitions`` optimizer mini-batches, keeping every group intact.

    Groups are dealt, largest first, each to the partition with the fewest rows so far
    (ties to the lowest index), after a seeded shuffle so that partitions mix group
    kinds. With ``strata`` (one label per row, constant within a group, e.g. "new",
    "replay", "bcq", "ncq") each stratum is dealt in turn, which spreads every kind
    evenly too. Deterministic given ``rng`` (a ``random.Random`` or a seed).

    Returns one list of row indices per partition, ascending; partitions may be empty
    when there are fewer groups than partitions.
    """
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if strata is not None and len(strata) != len(group_ids):
        raise ValueError(f"{len(strata)} strata labels but {len(group_ids)} rows")
    rng = rng if isinstance(rng, random.Random) else random.Random(rng)

    rows: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        rows.setdefault(g, []).append(i)
    stratum_of: dict[Hashable, Hashable] = {}
    if strata is not None:
        for g, members in rows.items():
            labels = {strata[i] for i in members}
            if len(labels) != 1:
                raise ValueError(f"group {g!r} spans strata {sorted(map(str, labels))}")
            stratum_of[g] = labels.pop()

    order = list(rows)
    rng.shuffle(order)
    stratum_rank = {s: n for n, s in enumerate(dict.fromkeys(stratum_of[g] for g in rows))} if strata else {}
    # Stable sort: strata in first-seen order, then larger groups first, then shuffled order.
    order.sort(key=lambda g: (stratum_rank.get(stratum_of.get(g), 0), -len(rows[g])))

    partitions: list[list[int]] = [[] for _ in range(num_partitions)]
    for g in order:
        target = min(range(num_partitions), key=lambda p: (len(partitions[p]), p))
        partitions[target].extend(rows[g])
    return [sorted(p) for p in partitions]
