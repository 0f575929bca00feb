"""Macro averages and the paired setting-bootstrap of the paper's evaluation.

The bootstrap follows the paper's appendix on statistical reliability: inside one
(scale, family) block, redraw the reported settings with replacement, recompute the paired
macro-average delta, and report the full-sample delta, a percentile interval and the win
count. The unit is one setting (OCR-EN/OCR-ZH and VMME/VMME-S enter separately), and all
comparison columns of a row are drawn on the same resampled settings. The intervals measure
sensitivity to the choice of benchmarks, not run-to-run noise.

Sign convention: ``delta = mean(a - b)`` and ``wins`` counts settings with ``a > b``, so
``paired_bootstrap(zppo, baseline)`` is the paper's "ZPPO - baseline" cell.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from .tasks import FAMILIES

EXACT_MAX_SETTINGS = 10
"""Largest block `paired_bootstrap(..., resamples=None)` enumerates: C(2n-1, n) count vectors,
92,378 at n = 10 (the paper enumerates blocks of 7 and 3 settings)."""


@dataclass(frozen=True)
class BootstrapResult:
    """A paired-bootstrap cell: ``delta [low, high] (wins/n)`` in the units of the scores.

    `resamples` is the number of drawn resamples, or None where the distribution was
    enumerated exactly.
    """

    delta: float
    low: float
    high: float
    wins: int
    n: int
    confidence: float
    resamples: int | None

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval lies strictly on one side of zero."""
        return self.low > 0 or self.high < 0

    def __str__(self) -> str:
        return f"{self.delta:+.2f} [{self.low:+.2f}, {self.high:+.2f}] ({self.wins}/{self.n})"


def bootstrap_indices(n: int, resamples: int = 10_000, seed: int = 0) -> np.ndarray:
    """Resampled setting positions, shape ``(resamples, n)``, drawn with replacement.

    The draw depends only on ``(n, resamples, seed)``, so every comparison of a block made
    with the same seed is drawn on the same settings: the paper's shared resample.
    """
    if n < 1:
        raise ValueError(f"need at least one setting, got n={n}")
    if resamples < 1:
        raise ValueError(f"resamples must be positive, got {resamples}")
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def paired_bootstrap(
    a: Mapping[str, float],
    b: Mapping[str, float],
    resamples: int | None = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    *,
    indices: np.ndarray | None = None,
) -> BootstrapResult:
    """Paired setting-bootstrap of ``mean(a - b)`` over one block of settings.

    a, b: setting -> score, with the same settings. Settings are taken in sorted name order,
    so the result does not depend on the mappings' insertion order. The interval is the
    percentile interval of the resampled means, each tail at the smallest value whose
    cumulative probability reaches it (numpy's ``inverted_cdf``; on the exact distribution this
    reproduces the paper's enumerated Tab. ci_backbones to the printed digit).

    resamples: number of draws from `bootstrap_indices(n, resamples, seed)`; None enumerates
    the resample distribution exactly (no seed, no Monte Carlo error; blocks of at most
    `EXACT_MAX_SETTINGS`). indices: explicit ``(R, n)`` positions into the sorted settings,
    overriding `resamples` and `seed`, to share one draw across calls.
    """
    diffs = _paired_differences(a, b)
    _check_confidence(confidence)
    tail = (1.0 - confidence) / 2.0
    if indices is not None:
        indices = np.asarray(indices)
        if indices.ndim != 2 or indices.shape[1] != diffs.size or indices.shape[0] < 1:
            raise ValueError(f"indices must have shape (resamples, {diffs.size}), got {indices.shape}")
        if indices.min() < 0 or indices.max() >= diffs.size:
            raise ValueError(f"indices must lie in [0, {diffs.size})")
    elif resamples is not None:
        indices = bootstrap_indices(diffs.size, resamples, seed)
    if indices is None:
        values, cumulative = _exact_distribution(diffs)
        # A small slack keeps float drift in the cumulative sum from skipping an atom that
        # reaches the tail probability exactly.
        low = values[np.searchsorted(cumulative, tail - 1e-12)]
        high = values[np.searchsorted(cumulative, 1.0 - tail - 1e-12)]
        drawn = None
    else:
        means = diffs[indices].mean(axis=1)
        low, high = np.quantile(means, [tail, 1.0 - tail], method="inverted_cdf")
        drawn = int(indices.shape[0])
    return BootstrapResult(
        delta=float(diffs.mean()),
        low=float(low),
        high=float(high),
        wins=int((diffs > 0).sum()),
        n=int(diffs.size),
        confidence=confidence,
        resamples=drawn,
    )


def paired_bootstrap_columns(
    target: Mapping[str, float],
    comparators: Mapping[str, Mapping[str, float]],
    resamples: int | None = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, BootstrapResult]:
    """One row of a comparison table: `target` minus each comparator, on one shared resample.

    comparators: column name -> setting -> score, each over exactly `target`'s settings.
    Returns column name -> result, in the comparators' order.
    """
    for column, scores in comparators.items():
        _check_same_settings(target, scores, f"target and comparator {column!r}")
    indices = None if resamples is None else bootstrap_indices(len(target), resamples, seed)
    return {
        column: paired_bootstrap(target, scores, resamples, seed, confidence, indices=indices)
        for column, scores in comparators.items()
    }


def paired_bootstrap_table(
    target: Mapping[str, float],
    comparators: Mapping[str, Mapping[str, float]],
    resamples: int | None = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    families: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, dict[str, BootstrapResult]]:
    """One scale of the paper's CI tables: `paired_bootstrap_columns` inside each family block.

    Settings are split by family (default: the suite's `FAMILIES`) and never resampled across
    families. Each block draws its own `resamples` with `seed`, shared by its columns.
    Returns family -> column -> result for the families with at least one setting present.
    """
    families = FAMILIES if families is None else families
    family_of = {name: family for family, names in families.items() for name in names}
    unknown = sorted(set(target) - set(family_of))
    if unknown:
        raise ValueError(f"settings outside every family: {', '.join(unknown)}")
    table: dict[str, dict[str, BootstrapResult]] = {}
    for family in families:
        block = [name for name in target if family_of[name] == family]
        if not block:
            continue
        table[family] = paired_bootstrap_columns(
            {name: target[name] for name in block},
            {column: _restrict(scores, block, column) for column, scores in comparators.items()},
            resamples,
            seed,
            confidence,
        )
    return table


def macro_average(
    scores: Mapping[str, float],
    family: str | None = None,
    families: Mapping[str, Iterable[str]] | None = None,
) -> float:
    """Macro average of setting scores, each setting weighted once (the paper's Avg cells).

    With `family`, only that family's settings among `scores` count (default families: the
    suite's `FAMILIES`); settings outside it are ignored. Raises ValueError when none count.
    """
    if family is not None:
        members = set((FAMILIES if families is None else families)[family])
        scores = {name: value for name, value in scores.items() if name in members}
    if not scores:
        raise ValueError(f"no settings to average{'' if family is None else f' in family {family!r}'}")
    return math.fsum(float(value) for value in scores.values()) / len(scores)


def family_macro_averages(
    scores: Mapping[str, float],
    families: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, float]:
    """Family -> macro average, for each family with at least one setting in `scores`."""
    families = FAMILIES if families is None else families
    return {
        family: macro_average(scores, family, families)
        for family, names in families.items()
        if any(name in scores for name in names)
    }


def mean_and_stderr(values: Iterable[float]) -> tuple[float, float]:
    """Mean over evaluation passes (or runs) and its standard error.

    The standard error is the sample standard deviation (ddof=1, the unbiased variance over
    the N passes) divided by sqrt(N); it is NaN for a single value, where it is undefined.
    """
    array = np.asarray(list(values), dtype=float)
    if array.size == 0:
        raise ValueError("no values")
    if array.size == 1:
        return float(array[0]), math.nan
    return float(array.mean()), float(array.std(ddof=1) / math.sqrt(array.size))


def _paired_differences(a: Mapping[str, float], b: Mapping[str, float]) -> np.ndarray:
    _check_same_settings(a, b, "a and b")
    if not a:
        raise ValueError("no settings to compare")
    diffs = np.array([float(a[name]) - float(b[name]) for name in sorted(a)])
    if not np.isfinite(diffs).all():
        raise ValueError("scores must be finite")
    return diffs


def _check_same_settings(a: Mapping[str, float], b: Mapping[str, float], what: str) -> None:
    if set(a) != set(b):
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        raise ValueError(
            f"{what} must score the same settings; only in the first: {only_a}, only in the second: {only_b}"
        )


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")


def _restrict(scores: Mapping[str, float], names: list[str], column: str) -> dict[str, float]:
    missing = [name for name in names if name not in scores]
    if missing:
        raise ValueError(f"comparator {column!r} lacks settings: {', '.join(missing)}")
    return {name: scores[name] for name in names}


def _exact_distribution(diffs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted resample means and their cumulative probabilities, over all count vectors.

    A resample of n settings is a multiset; its probability is the multinomial
    n! / prod(c_i!) / n^n of its count vector c.
    """
    n = diffs.size
    if n > EXACT_MAX_SETTINGS:
        raise ValueError(f"exact enumeration is limited to {EXACT_MAX_SETTINGS} settings, got {n}; pass resamples")
    draws = np.array(list(itertools.combinations_with_replacement(range(n), n)), dtype=np.intp)
    counts = np.zeros((draws.shape[0], n), dtype=np.intp)
    np.add.at(counts, (np.repeat(np.arange(draws.shape[0]), n), draws.ravel()), 1)
    log_factorial = np.array([math.lgamma(k + 1) for k in range(n + 1)])
    weights = np.exp(log_factorial[n] - log_factorial[counts].sum(axis=1) - n * math.log(n))
    means = counts @ diffs / n
    order = np.argsort(means, kind="stable")
    cumulative = np.cumsum(weights[order])
    return means[order], cumulative / cumulative[-1]
