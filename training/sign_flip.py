"""The paired permutation (sign-flip) test of two models on the same units (training/statistics.py's
`UnitScores` and their clusters), the report's test of a median or a mean over groups.

`sign_flip_pvalues` tests "the two models' scores are exchangeable on each unit" (each per-unit
difference symmetric about 0; with equal means but skewed differences it rejects 7.5-15 % at 0.05,
so a difference in means is tested by training/report/compare.py's bootstrap-t): each cluster's
two scores are swapped (`scipy.stats.permutation_test` with `permutation_type="samples"`). When
the 2^n swap patterns number no more than the resamples, every pattern is enumerated, as scipy
does, and the p-value is exact and seed-independent: `p = min(1, 2 min(#{null <= observed},
#{null >= observed}) / 2^n)`; otherwise `resamples` random patterns give `p = min(1, 2 min(#{null
<= observed} + 1, #{null >= observed} + 1) / (B + 1))` (scipy's two-sided p-value: twice the
smaller tail, a tolerance of 100 ulp on observed). The observed statistic is the no-swap row of
the null's own computation, so it counts itself (a separately computed value(a) - value(b) missed
the tolerance and gave p = 0, #50). Units linked by `partners` are swapped as independent.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from training import statistics
from training.statistics import UnitScores, unit_sets


def swaps(n: int, resamples: int, seed: int, width: int = 0) -> Iterator[np.ndarray]:
    """Pages of (rows, n) booleans: whether each cluster's two scores are swapped; every one of
    the 2^n patterns once where they number no more than the resamples (scipy's rule)."""
    page = max(1, statistics.PAGE_CELLS // max(n, width, 1))  # width: the units a page of clusters becomes
    if n < 63 and 2**n <= resamples:
        bits = np.arange(n)
        for start in range(0, 2**n, page):
            rows = np.arange(start, min(2**n, start + page))
            yield (rows[:, None] >> bits) & 1 == 1
        return
    if resamples:  # the observed statistic: no swap, the `+ 1` of random patterns (none: no test)
        yield np.zeros((1, n), bool)
    rng = np.random.default_rng(seed)
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


def _pvalue(null: np.ndarray) -> float:
    """Two-sided, as scipy.stats.permutation_test computes it: twice the smaller tail (module
    docstring); `null[0]` is the observed statistic (no swap), so it counts itself."""
    observed = null[0]
    if not np.isfinite(observed):
        return float("nan")
    gamma = abs(np.finfo(np.float64).eps * 100 * observed)  # other patterns' ties, as scipy
    less, greater = np.count_nonzero(null <= observed + gamma), np.count_nonzero(null >= observed - gamma)
    return float(min(1.0, 2 * min(less, greater) / len(null)))


def sign_flip_pvalues(pairs: dict, resamples: int, seed: int, swapped: np.ndarray | None = None) -> dict:
    """key -> two-sided p-value of the paired permutation test of value(a) = value(b) for each
    `(a, b)` of `pairs` (module docstring). The pairs on one unit set share their swaps (of
    whole clusters; all 2^n patterns when `exact`, else drawn a page at a time from
    `default_rng(seed)`); `swapped` (rows x units) gives the random swaps instead."""
    for a, b in pairs.values():
        if a.n != b.n or a.units != b.units:
            raise ValueError(f"paired test of different units: {a.units} ({a.n}) vs {b.units} ({b.n})")
    nulls: dict = {key: [] for key in pairs}
    for (_, n, _), keys in unit_sets({key: a for key, (a, _) in pairs.items()}).items():
        if n == 0:
            continue
        first = pairs[keys[0]][0]
        index = first.cluster_index()
        given = None if swapped is None else [np.zeros((1, first.n), bool), swapped]
        for swap in given or swaps(first.n_clusters, resamples, seed, first.n):
            unit_swap = swap if index is None or swapped is not None else swap[:, index]
            for key, null in zip(keys, _nulls([pairs[key] for key in keys], unit_swap), strict=True):
                nulls[key].append(null)
    return {key: _pvalue(np.concatenate(nulls[key])) if nulls[key] else float("nan") for key in pairs}
