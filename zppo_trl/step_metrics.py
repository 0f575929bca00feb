"""The numbers one rollout step logs under ``zppo/``: advantages, admission bins, per-kind counts, totals.

Pure functions of what the step produced (no TRL, no trainer); the trainer gathers what they need from
every rank and puts their result in TRL's log.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any

import torch

from .rollout import CORRECT

__all__ = [
    "TOTALS",
    "accumulate_totals",
    "admission_bins",
    "advantage_stats",
    "bin_label",
    "kind_metrics",
    "memory_metrics",
    "service_metrics",
    "timing_metrics",
]

# Step metrics that also keep a running total (``<name>_total``), besides each augmentation kind's own.
TOTALS = (
    "compression_failures",
    "dropped",
    "prompts_over_context",
    "skipped_partitions",
    "admitted",
    "graduated",
    "evicted",
    "unscored_groups",
    "generated_tokens",
    "trained_tokens",
)
_KIND_TOTALS = ("", "_trained", "_correct", "_rollouts", "_signal", "_targets", "_leaked")


def advantage_stats(values: Sequence[float]) -> dict[str, float]:
    """``advantages/*`` over the rollouts an optimizer update trained (fillers and padding excluded)."""
    t = torch.tensor(values or [0.0], dtype=torch.float64)  # nothing trained: zeros, so every step logs every key
    return {
        "advantages/trained_rollouts": len(values),
        "advantages/mean": float(t.mean()),
        "advantages/std": float(t.std(unbiased=False)),
        "advantages/min": float(t.min()),
        "advantages/max": float(t.max()),
        "advantages/nonzero_fraction": float((t != 0).double().mean()),
        "positive_advantage_fraction": float((t > 0).double().mean()),
    }


def admission_bins(group_size: int, threshold: float) -> list[str]:
    """Plain-accuracy bins of hard questions at group size G: ``0ofG``, ``1ofG``, ... below the threshold."""
    return [f"{k}of{group_size}" for k in range(group_size + 1) if k / group_size < threshold]


def bin_label(accuracy: float, group_size: int) -> str:
    """The bin of a plain accuracy at group size G (``kofG``, k correct rollouts of G)."""
    return f"{math.floor(accuracy * group_size + 1e-9)}of{group_size}"


def kind_metrics(kinds: Iterable[str], planned: Sequence[str], groups_per_rank: Sequence[Sequence[tuple[str, Any]]],
                 rewards: torch.Tensor, group_size: int) -> dict[str, float]:  # fmt: skip
    """Per augmentation kind, over all ranks: instances planned (``planned``: the kind of each), groups
    trained, in-prompt accuracy, correct and total rollouts, and groups with a learning signal."""
    world = len(groups_per_rank)
    per_rank = rewards.view(world, -1) if rewards is not None else None  # None: a round without any group
    out: dict[str, float] = {}
    for kind in kinds:
        hits = total = signal = 0
        for r, groups in enumerate(groups_per_rank):
            for g, (k, _key) in enumerate(groups):
                if k == kind:
                    correct = int((per_rank[r, g * group_size : (g + 1) * group_size] > CORRECT).sum())
                    hits, total, signal = hits + correct, total + group_size, signal + int(0 < correct < group_size)
        out[kind] = sum(1 for k in planned if k == kind)
        out[f"{kind}_trained"] = total // group_size
        out[f"{kind}_accuracy"] = hits / total if total else 0.0
        out[f"{kind}_correct"], out[f"{kind}_rollouts"], out[f"{kind}_signal"] = hits, total, signal
    return out


def timing_metrics(per_rank: torch.Tensor, uses_teacher: bool) -> dict[str, float]:
    """The step's times and teacher counters from every rank's row of ``[step_s, teacher_wait_s, requests,
    failures, latency_mean_s]``: the slowest rank's times, summed requests."""
    step_time, teacher_wait = float(per_rank[:, 0].max()), float(per_rank[:, 1].max())
    out = {
        "time/rollout_step_s": step_time,
        "time/teacher_wait_s": teacher_wait,
        "teacher_wait_fraction": teacher_wait / step_time if step_time else 0.0,
    }
    if uses_teacher:
        out.update(service_metrics("teacher", per_rank[:, 2:5]))
    return out


def service_metrics(role: str, per_rank: torch.Tensor) -> dict[str, float]:
    """A server client's step counters from every rank's ``[requests, failures, latency_mean_s]`` row, under
    ``<role>/``: summed requests and failures, the slowest rank's mean latency."""
    return {
        f"{role}/requests": int(per_rank[:, 0].sum()),
        f"{role}/failures": int(per_rank[:, 1].sum()),
        f"{role}/latency_s": float(per_rank[:, 2].max()),
    }


def memory_metrics(per_rank: torch.Tensor) -> dict[str, float]:
    """The host memory of the largest rank from every rank's ``[rss_gb, peak_rss_gb]`` row: its resident
    memory at the end of the step's generation (``rss_gb``) and the most it has held so far (``rss_peak_gb``)."""
    return {"rss_gb": float(per_rank[:, 0].max()), "rss_peak_gb": float(per_rank[:, 1].max())}


def accumulate_totals(
    counters: MutableMapping[str, float], metrics: Mapping[str, float], kinds: Iterable[str]
) -> None:
    """Add this step's counts to the running ``<name>_total`` counters (the step metrics of :data:`TOTALS`
    and each augmentation kind's counts)."""
    kind_names = [kind + suffix for kind in kinds for suffix in _KIND_TOTALS if kind + suffix in metrics]
    for name in (*TOTALS, *kind_names):
        counters[f"{name}_total"] += metrics.get(name, 0)
