"""Uncertainty of the evaluation's numbers, from per-unit scores (nothing is encoded again).

A metric is a function of its units (`UnitScores`): images with all their captions for
retrieval, queries for ODmAP@k, pairs for the ITM deltas, removal pairs for PN, test images for
zero-shot. Its value is a ratio of sums over the units (`num / den`), a mean over groups of such
ratios (COCO 1K folds, per-class recall), or the median of the units' values. Units that share a
source (counterfactual pairs or decorrelation queries made from one COCO image) carry the same
`clusters` id: the independent unit is then the cluster, and everything below resamples,
swaps and counts clusters (a cluster bootstrap; `n_clusters` beside `n`).

- `bootstrap`: each metric on `resamples` resamples of its clusters drawn with replacement, as
  `scipy.stats.bootstrap` draws them (`default_rng(seed).integers(0, n, (B, n))`), the same for
  every metric on the same units and every model (the paired bootstrap of a difference); a
  resample is a row of draw counts, made a page at a time (memory bounded by `PAGE_CELLS`).
- `intervals`: the interval a metric's kind needs (`Interval.method`; each cited in
  docs/report.md), clipped to the values it can take (`UnitScores.limits`): a proportion:
  Clopper-Pearson on Korn & Graubard's effective trials; a ratio of sums: the studentized
  bootstrap, or with `partners` a t interval on the dyadic se (`dyadic_t`); a median or a mean
  over groups: the percentile one. None, with its reason (`Interval.note`): fixed by
  construction (`trivial`), all units equal, one cluster or, but for a proportion, fewer than
  MIN_CLUSTERS. `paired_intervals`: the same for two models' difference (proportions: `newcombe`).
- `holm`: Holm's adjustment of a family of p-values (the paired tests: training/report/compare.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

#: The fewest clusters a bootstrap interval and a paired test are made from: the fewest at which
#: a two-sided sign-flip test can reject at 0.05 (2 / 2^6 = 0.031); below it the bootstrap-t's
#: resamples of one cluster have se* near 0 (3 clusters gave [0.0002, 1905521.4843]).
MIN_CLUSTERS = 6
#: A resample's se* in the bootstrap-t is at least this share of the sample's se: one that draws
#: near-equal clusters has se* near 0 and t* explodes ([-0.08, 81375214], #42); the floor keeps
#: each side within 10 ranges of the values, and `UnitScores.limits` within the metric's range.
SE_FLOOR = 0.1
#: The `Interval.note` of a bootstrap interval not made for want of clusters.
FEW_CLUSTERS = f"fewer than {MIN_CLUSTERS} clusters"
#: Default resamples of `counterfactory benchmark --bootstrap` and of the trainer's evaluation.
DEFAULT_RESAMPLES = 1000
LEVEL = 0.95
ALPHA = 0.05
#: Draw counts held at once (resample rows x units): 4M float64 cells, 32 MB.
PAGE_CELLS = 1 << 22
#: The most resamples a report or run takes: each metric (and each paired difference) keeps its
#: resampled values, 8 bytes each, so 10^6 resamples is 8 MB a metric (the draws are paged).
MAX_RESAMPLES = 1_000_000


@dataclass(frozen=True)
class UnitScores:
    """One metric as a function of its units. `units` names the unit set (metrics on one set
    share their resamples); `num`/`den` are per-unit sums (den None: one per unit); `groups`
    (int per unit): the metric is the mean over groups of each group's ratio; `median`: the
    median of `num`; `clusters` (int per unit): units of one cluster are resampled and swapped
    together (None: each unit its own); `proportion`: num counts hits of den trials (den None:
    one a unit); `trivial`: the value is fixed by construction (R@K with K >= the gallery);
    `partners` (int per unit, -1: none): unit i also uses unit partners[i]'s image or caption
    (a real pair's random partner, `robust_se`); `bounds`: the values it can take (`limits`)."""

    units: str
    num: np.ndarray
    den: np.ndarray | None = None
    groups: np.ndarray | None = None
    median: bool = False
    clusters: np.ndarray | None = None
    proportion: bool = False
    trivial: bool = False
    partners: np.ndarray | None = None
    bounds: tuple[float, float] | None = None

    def limits(self) -> tuple[float, float]:
        """The values the metric can take: `bounds`, [0, 1] for a proportion, else unbounded."""
        return self.bounds or ((0.0, 1.0) if self.proportion else (-np.inf, np.inf))

    @property
    def n(self) -> int:
        return len(self.num)

    @property
    def n_clusters(self) -> int:
        return self.n if self.clusters is None else len(np.unique(self.clusters))

    def counted(self) -> tuple[int, int]:
        """(units, clusters) that enter the value: those with a positive den (a class's queries
        among all the set's), all of them without den."""
        live = np.ones(self.n, bool) if self.den is None else np.asarray(self.den) > 0
        return int(live.sum()), len(np.unique(self.unit_clusters()[live]))

    def cluster_index(self) -> np.ndarray | None:
        """Each unit's cluster as 0..n_clusters-1 (None without clusters)."""
        return None if self.clusters is None else np.unique(self.clusters, return_inverse=True)[1].ravel()

    def unit_clusters(self) -> np.ndarray:
        """`cluster_index`, or each unit its own cluster (0..n-1) without clusters."""
        index = self.cluster_index()
        return np.arange(self.n) if index is None else index

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


def first_seen(ids) -> np.ndarray:
    """Cluster ids 0, 1, ... numbered in order of first appearance: two unit sets with the same
    partition (a generator's common pairs and another's) get the same array, so they share
    their resamples and swaps."""
    _, first, inverse = np.unique(np.asarray(ids), return_index=True, return_inverse=True)
    return np.argsort(np.argsort(first))[inverse.ravel()]


def weighted_median(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """np.median of each resample (row of draw counts) of `values`, without materialising it."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(counts[:, order], axis=1)
    total = cum[:, -1]
    low = np.argmax(cum > ((total - 1) // 2)[:, None], axis=1)
    high = np.argmax(cum > (total // 2)[:, None], axis=1)
    return (values[order][low] + values[order][high]) / 2


def resample_pages(n: int, resamples: int, seed: int, width: int = 0) -> Iterator[np.ndarray]:
    """Draw counts of `resamples` bootstrap resamples of `n` units, a page of rows at a time;
    the indices are those of one `default_rng(seed).integers(0, n, (resamples, n))` call (the
    generator's stream does not depend on the page size)."""
    rng = np.random.default_rng(seed)
    page = max(1, PAGE_CELLS // max(n, width, 1))  # width: the units a page of clusters becomes
    for start in range(0, resamples, page):
        rows = min(page, resamples - start)  # each row's draws as counts of each unit
        flat = (rng.integers(0, n, (rows, n)) + (np.arange(rows) * n)[:, None]).ravel()
        yield np.bincount(flat, minlength=rows * n).reshape(rows, n).astype(np.float64)


def unit_sets(metrics: dict) -> dict[tuple, list]:
    """Metrics on one unit set (same name, size and clusters), which share their resamples."""
    by_units: dict[tuple, list] = {}
    for name, m in metrics.items():
        clusters = None if m.clusters is None else np.asarray(m.clusters).tobytes()
        by_units.setdefault((m.units, m.n, clusters), []).append(name)
    return by_units


def cluster_pages(metric: UnitScores, resamples: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(cluster draw counts, unit draw counts) of `resamples` resamples of `metric`'s clusters,
    a page at a time (without clusters both are the units' counts)."""
    index = metric.cluster_index()
    for counts in resample_pages(metric.n_clusters, resamples, seed, metric.n):
        yield counts, counts if index is None else counts[:, index]


def bootstrap(metrics: dict, resamples: int, seed: int) -> dict:
    """name -> the metric on each of `resamples` resamples of its clusters (its units); the
    metrics of one unit set share every resample."""
    out: dict = {name: [] for name in metrics}
    for (_, n, _), names in unit_sets(metrics).items():
        if n == 0:
            continue
        for _, counts in cluster_pages(metrics[names[0]], resamples, seed):
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
    low, high = np.quantile(finite, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(low), float(high)


@dataclass(frozen=True)
class Interval:
    """A metric's 95 % interval (NaN where none), its `method` (clopper-pearson, newcombe, studentized,
    dyadic-t, percentile; none: `note` says why), `trivial` (the units cannot move it), n, clusters."""

    low: float
    high: float
    method: str
    n: int
    n_clusters: int
    trivial: bool = False
    note: str | None = None


def no_interval(m: UnitScores) -> str | None:
    """Why `m` gets no interval (None: it gets one); a paired difference's are its per-unit
    differences' (`paired_intervals`). All units equal: to 1,000 ulp of the largest (x - (x - 0.5) is not 0.5)."""
    (n, clusters), den = m.counted(), np.ones(m.n) if m.den is None else np.asarray(m.den, np.float64)
    if m.trivial:
        return "fixed by construction"
    if clusters < 2 and not (m.proportion and clusters):
        return "one cluster" if n else "no units"
    values = m.num[den > 0] / den[den > 0]  # each unit's own value
    if n and not m.proportion and np.ptp(values) <= 1e3 * np.finfo(np.float64).eps * np.abs(values).max():
        return f"all {n:,} units equal"
    if clusters < MIN_CLUSTERS and not (m.proportion and m.groups is None):  # a bootstrap
        return FEW_CLUSTERS
    return None


def intervals(metrics: dict, resamples: int, seed: int, level: float = LEVEL) -> dict:
    """name -> `Interval` of each metric (module docstring: the method follows its kind), within
    its `limits`; the resamples are `bootstrap`'s (the same units, the same seed, the same draws)."""
    out: dict = {}
    for names in unit_sets(metrics).values():
        for name in names:
            m = metrics[name]
            if note := no_interval(m):
                out[name] = Interval(np.nan, np.nan, "none", *m.counted(), m.trivial, note)
            elif m.proportion and m.groups is None:
                out[name] = Interval(*clopper_pearson(m, level), "clopper-pearson", *m.counted())
            elif len(partner_links(m)) and not m.median and m.groups is None:
                out[name] = Interval(*dyadic_t(m, level), "dyadic-t", *m.counted())
        rest = [name for name in names if name not in out]
        linear = [name for name in rest if not metrics[name].median and metrics[name].groups is None]
        found, tail = {}, (1 - level) / 2  # equal-tailed bootstrap-t (the alternatives measured: docs/report.md)
        for name, (value, se, t) in bootstrap_t({k: metrics[k] for k in linear}, resamples, seed).items():
            t_low, t_high = np.quantile(t, [tail, 1 - tail]) if len(t) and np.isfinite(se) else (np.nan, np.nan)
            found[name] = (float(value - t_high * se), float(value - t_low * se))  # value - t* se
        others = bootstrap({k: metrics[k] for k in rest if k not in linear}, resamples, seed)
        for name in rest:
            low, high = np.clip(found.get(name) or interval(others[name], level), *metrics[name].limits())
            method = "studentized" if name in found else "percentile"
            out[name] = Interval(float(low), float(high), method, *metrics[name].counted())
    return out


def paired_difference(a: UnitScores, b: UnitScores) -> UnitScores | None:
    """value(a) - value(b) as one ratio metric on their units (num a - num b over the shared
    den, within a's limits minus b's), whose interval `intervals` gives; None where the
    difference is not linear in the units (a median, a mean over groups, different denominators)."""
    linear = not (a.median or b.median) and a.groups is None and b.groups is None
    same_den = (a.den is None) == (b.den is None) and (a.den is None or np.array_equal(a.den, b.den))
    if not linear or not same_den or a.n != b.n:
        return None
    (la, ua), (lb, ub), num = a.limits(), b.limits(), a.num - b.num
    return UnitScores(a.units, num, a.den, clusters=a.clusters, partners=a.partners, bounds=(la - ub, ua - lb))


def paired_intervals(pairs: dict, resamples: int, seed: int, level: float = LEVEL) -> dict:
    """key -> `Interval` of value(a) - value(b) for each (a, b) in `pairs`: none with the notes of
    `no_interval` of their per-unit differences (units that all differ alike: all units equal),
    the one answer of the interval and of compare.py's test, or without resamples; two
    proportions: `newcombe`; another linear difference: `intervals`' of `paired_difference`;
    else percentile, whose ends `difference_interval` takes from the paired resampled ones."""
    out, linear = {}, {}
    for key, (a, b) in pairs.items():
        d = paired_difference(a, b)
        same = UnitScores(a.units, a.num - b.num, d and d.den, clusters=a.clusters, trivial=a.trivial or b.trivial)
        if (note := no_interval(same)) or not resamples:  # --bootstrap 0: none, as for one metric
            out[key] = Interval(np.nan, np.nan, "none", *same.counted(), same.trivial, note)
        elif d is not None and a.proportion and b.proportion:
            out[key] = Interval(*newcombe(a, b, level), "newcombe", *same.counted())
        elif d is not None:
            linear[key] = d
        else:
            out[key] = Interval(np.nan, np.nan, "percentile", *same.counted())
    return out | intervals(linear, resamples, seed, level)


def difference_interval(found: Interval, spread: np.ndarray) -> tuple[float, float]:
    """A paired difference's interval: `paired_intervals`' (`found`), the percentile interval of
    the paired resampled differences (`spread`) where that is its method."""
    return interval(spread) if found.method == "percentile" else (found.low, found.high)


def cluster_sums(metric: UnitScores) -> tuple[np.ndarray, np.ndarray]:
    """The per-cluster sums of a ratio metric's num and den (the units' own without clusters)."""
    den, index = np.ones(metric.n) if metric.den is None else metric.den, metric.unit_clusters()
    return np.bincount(index, metric.num), np.bincount(index, den)


def _ratio_and_se(counts: np.ndarray, num: np.ndarray, den: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sum(w num) / sum(w den) on each row w of cluster `counts`, and its linearised standard
    error (the residuals num - ratio den of the clusters drawn, with the c / (c - 1) factor)."""
    c = np.count_nonzero(den)
    total = counts @ den
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = (counts @ num) / total
        squares = counts @ (num * num) - 2 * ratio * (counts @ (num * den)) + ratio**2 * (counts @ (den * den))
        se = np.sqrt(np.maximum(squares, 0) * c / max(c - 1, 1)) / total
    return ratio, se


def partner_links(metric: UnitScores) -> np.ndarray:
    """(links, 2) the pairs of distinct clusters (units without clusters) that share an input
    through `partners`, each once however many units link them (a 2-cycle of the derangement,
    i -> j -> i, is one link)."""
    if metric.partners is None:
        return np.empty((0, 2), np.int64)
    partners, index = np.asarray(metric.partners), metric.unit_clusters()
    linked = np.flatnonzero(partners >= 0)
    a, b = index[linked], index[partners[linked]]
    pairs = np.stack([np.minimum(a, b), np.maximum(a, b)], 1)[a != b]
    return np.unique(pairs, axis=0)


def _linked(links: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Each cluster's sum of `v` over the clusters `links` ties it to (A v, A the links' adjacency)."""
    return np.bincount(links[:, 0], v[links[:, 1]], len(v)) + np.bincount(links[:, 1], v[links[:, 0]], len(v))


def _residuals(metric: UnitScores) -> tuple[np.ndarray, np.ndarray]:
    """The clusters' linearised residuals e = num - value den, and each one's sum of the residuals
    of the clusters linked to it by `partners` (`_linked`)."""
    a, d = cluster_sums(metric)
    e = a - a.sum() / d.sum() * d
    return e, _linked(partner_links(metric), e)


def robust_se(metric: UnitScores) -> float:
    """The se of a ratio metric whose clusters are linked by `partners`: the dyadic cluster-robust
    variance (Cameron, Gelbach & Miller 2011; Fafchamps & Gubert 2007) of the c clusters'
    residuals e, (sum e_k^2 + 2 sum_links e_a e_b) / (sum den)^2 x c^2 / (c^2 - c - 2 L) for L
    links (the iid c / (c - 1) for a dependence graph: residuals about the estimate sum to 0).
    Without partners, or where not positive (small c), the iid `_ratio_and_se`."""
    a, d = cluster_sums(metric)
    se = _ratio_and_se(np.ones((1, len(a))), a, d)[1][0]
    (e, linked), links = _residuals(metric), partner_links(metric)
    c, cells = np.count_nonzero(d), np.count_nonzero(d) + 2 * len(links)
    if not len(links) or c * c <= cells:
        return float(se)
    variance = (e @ (e + linked)) / d.sum() ** 2 * c * c / (c * c - cells)
    return float(np.sqrt(variance)) if variance > 0 else float(se)


def dyadic_df(metric: UnitScores, working: float | None = None) -> float:
    """The degrees of freedom of `robust_se`'s variance V, the smaller of two Satterthwaite (1946)
    approximations as Bell & McCaffrey (2002) refer V to t: the empirical one, 2 V^2 / (c var(s)),
    s_k = e_k (e_k + linked e) the clusters' shares of V (it sees an image effect in IR_r, where V
    is the small difference of two large sums), and `working_df`'s (`working`, where the caller
    has it). The empirical one alone is noisy where linked units move together: the adverse real
    pairs' test rejected 9.1 % of nulls at n = 8 (benchmarks/report_coverage.py; now 2-4 %)."""
    (e, linked), d = _residuals(metric), cluster_sums(metric)[1]
    s = (e * (e + linked))[d > 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        empirical = 2 * s.sum() ** 2 / (len(s) * s.var(ddof=1))
    working = working_df(metric) if working is None else working
    return max(float(min(empirical, working) if np.isfinite(empirical) else working), 1.0)


def working_df(metric: UnitScores) -> float:
    """Bell & McCaffrey's (2002) Satterthwaite df of `robust_se`'s variance under a working model
    of independent clusters of equal variance (Pustejovsky & Tipton 2018), (tr Q)^2 / tr(Q^2),
    Q = M'(I + A)M, M = I - u 1' (u = den / sum den) the residual maker, A the links: c - 1
    without links."""
    links, d = partner_links(metric), cluster_sums(metric)[1]
    # Q = W - 1 p' - p 1' + r 1 1' with W = I + A, p = W u, r = u' W u: its trace and squared norm.
    n, u, w1 = len(d), d / d.sum(), 1 + _linked(links, np.ones(len(d)))
    p = u + _linked(links, u)
    r, total = u @ p, p.sum()
    trace = n - 2 * total + n * r
    squares = n + 2 * len(links) + 2 * n * (p @ p) + (n * r) ** 2
    squares += 2 * (r * w1.sum() + total**2 - 2 * (w1 @ p) - 2 * n * r * total)
    # Two clusters, each the other's partner, leave the working model no residual (Q = 0, 0/0): the floor.
    return max(float(trace**2 / squares), 1.0) if squares > 0 else 1.0


def dyadic_t(metric: UnitScores, level: float = LEVEL) -> tuple[float, float]:
    """value -/+ t(`dyadic_df`) `robust_se` where units are linked by `partners`, clipped to the
    metric's range; its test of 0 is compare.mean_tests'."""
    from scipy import special  # t.ppf's function, without scipy.stats' 0.6 s import

    t = special.stdtrit(dyadic_df(metric), 1 - (1 - level) / 2)
    return tuple(np.clip(metric.value() + np.array([-t, t]) * robust_se(metric), *metric.limits()).tolist())


def bootstrap_t(metrics: dict, resamples: int, seed: int) -> dict:
    """name -> (value, se, finite t*) of each ratio metric (of one unit set), on clusters: t* =
    (value* - value) / se* of each resample (se* at least SE_FLOOR se), se the `robust_se` (with
    `partners` the dyadic one); `intervals`' studentized one and compare.py's test of a difference in
    means use it. No resamples (`--bootstrap 0`): no t*, so no interval and no test."""
    sums = {name: cluster_sums(m) for name, m in metrics.items()}
    point = {name: _ratio_and_se(np.ones((1, len(a))), a, d) for name, (a, d) in sums.items()}
    ts: dict = {name: [] for name in metrics}
    for counts, _ in cluster_pages(next(iter(metrics.values())), resamples, seed) if metrics else ():
        for name, (a, d) in sums.items():
            ratio, se = _ratio_and_se(counts, a, d)
            (value,), (floor,) = point[name][0], SE_FLOOR * point[name][1]
            with np.errstate(invalid="ignore", divide="ignore"):
                ts[name].append((ratio - value) / np.maximum(se, floor))
    flat = {name: np.concatenate(parts) if parts else np.empty(0) for name, parts in ts.items()}
    return {name: (float(point[name][0][0]), robust_se(metrics[name]), t[np.isfinite(t)]) for name, t in flat.items()}


def clopper_pearson(metric: UnitScores, level: float = LEVEL) -> tuple[float, float]:
    """Clopper-Pearson on Korn & Graubard's (1998) effective trials: the trials over the design
    effect (`robust_se`^2 over the binomial variance, at least 1) times their degrees-of-freedom
    factor (t_(trials - 1) / t_(clusters - 1))^2; a proportion of 0 or 1 counts its clusters."""
    from scipy import special  # 0.25 s to import: only where an interval is made, not in a train-only run

    a, d = cluster_sums(metric)
    trials, clusters, tail = d.sum(), len(a), (1 - level) / 2
    p = a.sum() / trials  # trials > 0: no_interval says "no units" first
    if (np.all(d == 1) and metric.partners is None) or p <= 0 or p >= 1 or clusters < 2:
        n_eff = float(clusters)  # one independent trial a cluster (a plain binomial), or no design effect
    else:
        df_factor = (special.stdtrit(trials - 1, 1 - tail) / special.stdtrit(clusters - 1, 1 - tail)) ** 2
        n_eff = trials / max(1.0, robust_se(metric) ** 2 / (p * (1 - p) / trials)) * df_factor
    x = p * n_eff
    low = 0.0 if x <= 0 else float(special.betaincinv(x, n_eff - x + 1, tail))
    high = 1.0 if x >= n_eff else float(special.betaincinv(x + 1, n_eff - x, 1 - tail))
    return low, high


def newcombe(a: UnitScores, b: UnitScores, level: float = LEVEL) -> tuple[float, float]:
    """value(a) - value(b) of two proportions on the same units: Newcombe's (1998) hybrid interval
    for paired proportions (method 10; the MOVER of Zou & Donner 2008) from each one's
    `clopper_pearson` (l, u) and r, the correlation of their clusters' residuals (phi without
    clusters; partners' link terms, noisy at small n, left out): d = pa - pb, low = d -
    sqrt((pa - la)^2 + (ub - pb)^2 - 2 r (pa - la)(ub - pb)), high alike; within [-1, 1]."""
    (la, ua), (lb, ub) = clopper_pearson(a, level), clopper_pearson(b, level)
    (pa, pb), ea, eb = (a.value(), b.value()), _residuals(a)[0], _residuals(b)[0]
    r = float(ea @ eb / np.sqrt((ea @ ea) * (eb @ eb))) if (ea @ ea) * (eb @ eb) > 0 else 0.0
    low = pa - pb - np.sqrt(max((pa - la) ** 2 + (ub - pb) ** 2 - 2 * r * (pa - la) * (ub - pb), 0.0))
    high = pa - pb + np.sqrt(max((ua - pa) ** 2 + (pb - lb) ** 2 - 2 * r * (ua - pa) * (pb - lb), 0.0))
    return float(low), float(high)


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (NaN stays NaN and does not count in the family): the
    running maximum of min(1, (m - rank) p) over the p-values in increasing order."""
    p = np.asarray(pvalues, dtype=np.float64)
    out, order = np.full(p.shape, np.nan), np.flatnonzero(np.isfinite(p))
    order = order[np.argsort(p[order], kind="stable")]
    out[order] = np.maximum.accumulate(np.minimum(1.0, (len(order) - np.arange(len(order))) * p[order]))
    return out
