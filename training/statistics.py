"""Uncertainty of the evaluation's numbers, from per-unit scores (nothing is encoded again).

A metric is a function of its independent units (`UnitScores`): images with all their captions
for retrieval, queries for ODmAP@k, pairs for the ITM deltas, removal pairs for PN, test images
for zero-shot. Its value is a ratio of sums over the units (`num / den`), a mean over groups of
such ratios (COCO 1K folds, per-class recall), or the median of the units' values.

- `bootstrap`: each metric on `resamples` resamples of its units drawn with replacement, as
  `scipy.stats.bootstrap` draws them (`numpy.random.default_rng(seed).integers(0, n, (B, n))`),
  and `interval` their 2.5 % and 97.5 % quantiles (scipy's `method="percentile"`). Every metric
  on the same units, and every model, gets the same resamples: the difference of two models'
  resampled values is the paired bootstrap of their difference. Vectorised: a resample is a row of
  draw counts, so a ratio metric is two matrix products; rows are made a page at a time, so
  memory is bounded by `PAGE_CELLS`, not by the number of resamples.
- `sign_flip_pvalue`: the paired permutation test of "two models score the same units equally":
  each unit's two scores are swapped at random (`scipy.stats.permutation_test` with
  `permutation_type="samples"`), the two-sided p-value as scipy computes it for random
  permutations, `(#{|null| as extreme} + 1) / (B + 1)`.
- `holm`: Holm's step-down adjustment of a family of p-values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

#: Default resamples of `counterfactory benchmark --bootstrap` and of the trainer's evaluation.
DEFAULT_RESAMPLES = 1000
LEVEL = 0.95
ALPHA = 0.05
#: Draw counts held at once (resample rows x units): 4M float64 cells, 32 MB.
PAGE_CELLS = 1 << 22


@dataclass(frozen=True)
class UnitScores:
    """One metric as a function of its units. `units` names the unit set (metrics on one set
    share their resamples); `num`/`den` are per-unit sums (den None: one per unit); `groups`
    (int per unit): the metric is the mean over groups of each group's ratio; `median`: the
    median of `num`."""

    units: str
    num: np.ndarray
    den: np.ndarray | None = None
    groups: np.ndarray | None = None
    median: bool = False

    @property
    def n(self) -> int:
        return len(self.num)

    def value(self) -> float:
        return float(self.on(np.ones((1, self.n)))[0])

    def on(self, counts: np.ndarray) -> np.ndarray:
        """The metric on each row of `counts` (how often each unit was drawn)."""
        if self.median:
            return weighted_median(self.num, counts)
        den = np.ones(self.n) if self.den is None else self.den
        with np.errstate(invalid="ignore", divide="ignore"):
            if self.groups is None:
                return (counts @ self.num) / (counts @ den)
            order, starts = self._group_order()
            num = np.add.reduceat((counts * self.num)[:, order], starts, axis=1)
            den = np.add.reduceat((counts * den)[:, order], starts, axis=1)
            ratio = np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)
            seen = (den > 0).sum(1)
            return np.where(seen > 0, np.nansum(ratio, 1) / np.maximum(seen, 1), np.nan)

    def _group_order(self) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(self.groups, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(self.groups[order]) != 0])
        return order, starts

    def unit_weights(self) -> np.ndarray:
        """w with value = sum(num * w), for a ratio metric (the sign-flip test's linear form)."""
        den = np.ones(self.n) if self.den is None else self.den
        if self.groups is None:
            return np.full(self.n, 1.0 / den.sum())
        order, starts = self._group_order()
        group_den = np.add.reduceat(den[order], starts)
        per_unit = np.empty(self.n)
        per_unit[order] = np.repeat(group_den, np.diff(np.r_[starts, self.n]))
        live = (group_den > 0).sum()
        return np.where(per_unit > 0, 1.0 / (live * np.where(per_unit > 0, per_unit, 1)), 0.0)


def weighted_median(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """np.median of each resample (row of draw counts) of `values`, without materialising it."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(counts[:, order], axis=1)
    total = cum[:, -1]
    low = np.argmax(cum > ((total - 1) // 2)[:, None], axis=1)
    high = np.argmax(cum > (total // 2)[:, None], axis=1)
    return (values[order][low] + values[order][high]) / 2


def draw_counts(indices: np.ndarray, n: int) -> np.ndarray:
    """(rows, n) counts of each unit in each row of resample `indices`."""
    rows = len(indices)
    flat = (indices + (np.arange(rows) * n)[:, None]).ravel()
    return np.bincount(flat, minlength=rows * n).reshape(rows, n).astype(np.float64)


def resample_pages(n: int, resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Draw counts of `resamples` bootstrap resamples of `n` units, a page of rows at a time;
    the indices are those of one `default_rng(seed).integers(0, n, (resamples, n))` call (the
    generator's stream does not depend on the page size)."""
    rng = np.random.default_rng(seed)
    page = max(1, PAGE_CELLS // max(n, 1))
    for start in range(0, resamples, page):
        yield draw_counts(rng.integers(0, n, (min(page, resamples - start), n)), n)


def bootstrap(metrics: dict[str, UnitScores], resamples: int, seed: int) -> dict[str, np.ndarray]:
    """name -> the metric on each of `resamples` resamples of its units; the metrics of one
    unit set (same name and size) share every resample."""
    by_units: dict[tuple[str, int], list[str]] = {}
    for name, m in metrics.items():
        by_units.setdefault((m.units, m.n), []).append(name)
    out: dict[str, list[np.ndarray]] = {name: [] for name in metrics}
    for (_, n), names in by_units.items():
        if n == 0:
            continue
        for counts in resample_pages(n, resamples, seed):
            for name in names:
                out[name].append(metrics[name].on(counts))
    return {name: np.concatenate(parts) if parts else np.full(resamples, np.nan) for name, parts in out.items()}


def interval(distribution: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval of a bootstrap distribution (linear interpolation, as
    `scipy.stats.bootstrap(method="percentile")`); resamples without a value (a class no resample
    drew) are left out, NaN when none has one."""
    finite = distribution[np.isfinite(distribution)]
    if not len(finite):
        return float("nan"), float("nan")
    tail = (1 - level) / 2
    low, high = np.quantile(finite, [tail, 1 - tail])
    return float(low), float(high)


def swaps(n: int, resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Pages of (rows, n) booleans: whether each unit's two scores are swapped."""
    rng = np.random.default_rng(seed)
    page = max(1, PAGE_CELLS // max(n, 1))
    for start in range(0, resamples, page):
        yield rng.random((min(page, resamples - start), n)) < 0.5


def _nulls(pairs: list[tuple[UnitScores, UnitScores]], swap: np.ndarray) -> list[np.ndarray]:
    """value(a') - value(b') for each row of `swap` and each pair, a' and b' the scores after
    swapping: one matrix product for every ratio metric of the page, a median each."""
    out: list[np.ndarray | None] = [None] * len(pairs)
    linear = [k for k, (a, _) in enumerate(pairs) if not a.median]
    if linear:
        # Same units, same denominators: the difference is linear in the per-unit differences.
        weighted = np.stack([(pairs[k][0].num - pairs[k][1].num) * pairs[k][0].unit_weights() for k in linear], 1)
        product = (1 - 2 * swap.astype(np.float64)) @ weighted
        for j, k in enumerate(linear):
            out[k] = product[:, j]
    for k, (a, b) in enumerate(pairs):
        if a.median:
            out[k] = np.median(np.where(swap, b.num, a.num), 1) - np.median(np.where(swap, a.num, b.num), 1)
    return out


def _pvalue(observed: float, null: np.ndarray) -> float:
    """Two-sided, as scipy.stats.permutation_test computes it for random permutations."""
    if not np.isfinite(observed):
        return float("nan")
    gamma = abs(np.finfo(np.float64).eps * 100 * observed)
    less = (np.count_nonzero(null <= observed + gamma) + 1) / (len(null) + 1)
    greater = (np.count_nonzero(null >= observed - gamma) + 1) / (len(null) + 1)
    return float(min(1.0, 2 * min(less, greater)))


def sign_flip_pvalues(pairs: dict, resamples: int, seed: int, swapped: np.ndarray | None = None) -> dict:
    """key -> two-sided p-value of the paired permutation test of value(a) = value(b) for each
    `(a, b)` of `pairs` (module docstring). The pairs on one unit set share their swaps (drawn
    a page at a time from `default_rng(seed)`); `swapped` gives the swaps instead."""
    by_units: dict[tuple[str, int], list] = {}
    for key, (a, b) in pairs.items():
        if a.n != b.n or a.units != b.units:
            raise ValueError(f"paired test of different units: {a.units} ({a.n}) vs {b.units} ({b.n})")
        by_units.setdefault((a.units, a.n), []).append(key)
    nulls: dict = {key: [] for key in pairs}
    for (_, n), keys in by_units.items():
        if n == 0:
            continue
        for swap in [swapped] if swapped is not None else swaps(n, resamples, seed):
            for key, null in zip(keys, _nulls([pairs[key] for key in keys], swap), strict=True):
                nulls[key].append(null)
    return {
        key: _pvalue(a.value() - b.value(), np.concatenate(nulls[key])) if nulls[key] else float("nan")
        for key, (a, b) in pairs.items()
    }


def sign_flip_pvalue(
    a: UnitScores, b: UnitScores, resamples: int, seed: int, swapped: np.ndarray | None = None
) -> float:
    """`sign_flip_pvalues` of one pair."""
    return sign_flip_pvalues({0: (a, b)}, resamples, seed, swapped)[0]


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (NaN stays NaN and does not count in the family)."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    known = np.flatnonzero(np.isfinite(p))
    order = known[np.argsort(p[known], kind="stable")]
    m = len(order)
    running = 0.0
    for rank, k in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[k]))
        out[k] = running
    return out
