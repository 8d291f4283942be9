"""Paired comparisons of the models of one report, on the same units (training/statistics.py).

For every two models (or every model against `--baseline`) and every metric of a dataset's
comparison table that both scored with units: the difference, its 95 % paired bootstrap interval
(the same resamples of the same clusters for both models; studentized where the difference is
linear in the units, else percentile) and the paired permutation (sign-flip) p-value, Holm-adjusted
across exactly the tests of the table's columns. The per-class metrics (ODmAP@k and PN per removed
class) are a family of their own (`per_class=True`), on each class's units, with no test below
statistics.MIN_CLUSTERS clusters. `verdicts` tells the table which best value beats its runner-up at
alpha = 0.05 (bold); failing to reject is no equivalence, so the others are left unmarked.
`plot_forest` draws each model's value with its interval and n.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from statistics import NormalDist
from pathlib import Path

import numpy as np

from builders.viewer.plots import plain_text
from training.report.markdown import BLIND, higher_is_better, in_comparison, natural, sample_size
from training.report.per_class import class_of, testable
from training.report.results import record_name
from training.statistics import (
    ALPHA,
    MIN_CLUSTERS,
    UnitScores,
    bootstrap,
    difference_interval,
    holm,
    paired_intervals,
)
from training.sign_flip import sign_flip_pvalues


#: The power of the smallest detectable difference a column without a winner reports.
POWER = 0.8


@dataclass
class Comparison:
    dataset: str
    task: str
    metric: str
    model: str
    other: str
    difference: float  # value(model) - value(other)
    low: float
    high: float
    p_value: float
    p_holm: float = float("nan")
    n: int = 0  # the units both models were scored on
    n_clusters: int = 0  # their clusters (source images; the units where there are none)
    #: The smallest difference one test at alpha = 0.05 detects with 80 % power (`detectable`).
    detectable: float = float("nan")
    note: str | None = None  # why there is no interval (statistics.Interval.note)

    def as_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in vars(self).items()}


def _pairs(models: list[str], baseline: str | None) -> list[tuple[str, str]]:
    if baseline is None:
        return list(itertools.combinations(models, 2))
    return [(m, baseline) for m in models if m != baseline]


def compare_dataset(
    dataset: str,
    units: dict[str, dict[str, UnitScores]],
    models: list[str],
    resamples: int,
    seed: int,
    baseline: str | None = None,
    per_class: bool = False,
) -> list[Comparison]:
    """The paired comparisons of `dataset`, one Holm family; `units`: model -> evaluation key ->
    UnitScores. The metrics of the comparison table's columns, or (`per_class`) the per-class
    metrics, those with too few units shown untested (NaN)."""
    pairs = _pairs([m for m in models if m in units], baseline)
    keys = sorted(set.intersection(*(set(units[m]) for m in {x for p in pairs for x in p})) if pairs else [])
    keys = sorted(
        (k for k in keys if record_name(k) and _in_family(k, per_class)),
        key=lambda k: tuple(map(natural, record_name(k))),
    )
    compared = {x for p in pairs for x in p}
    tested = [k for k in keys if all(testable(k, units[m][k]) for m in compared)]
    resampled = bootstrap({(m, k): units[m][k] for m in compared for k in tested}, resamples, seed)
    paired = {(key, a, b): (units[a][key], units[b][key]) for key in tested for a, b in pairs}
    pvalues = sign_flip_pvalues(paired, resamples, seed)
    every = {(k, a, b): (units[a][k], units[b][k]) for k in keys for a, b in pairs if units[a][k].n == units[b][k].n}
    found = paired_intervals(every, resamples, seed)  # with each missing interval's reason
    out = []
    for key in keys:
        task, metric = record_name(key)
        for a, b in pairs:
            nan = float("nan")
            spread = resampled[(a, key)] - resampled[(b, key)] if key in tested else np.full(1, nan)
            n, clusters = units[a][key].counted()
            why = found.get((key, a, b))
            low, high = difference_interval(why, spread) if key in tested and why else (nan, nan)
            difference = units[a][key].value() - units[b][key].value()
            p = pvalues[(key, a, b)] if key in tested else nan
            c = Comparison(dataset, task, metric, a, b, difference, low, high, p, n=n, n_clusters=clusters)
            c.note = why and why.note  # no interval (a fixed metric, equal units): nothing to detect
            c.detectable = detectable(spread, clusters) if np.isfinite(low) else nan
            out.append(c)
    for c, p in zip(out, holm([c.p_value for c in out]), strict=True):
        c.p_holm = float(p)
    return out


def detectable(spread: np.ndarray, n: int, power: float = POWER) -> float:
    """The smallest true difference the paired sign-flip test of n clusters rejects at alpha =
    0.05 with `power` (`spread`: the difference's resampled values). The test's statistic,
    sum(d) / sqrt(sum(d^2)) against its normal limit, is a monotone function of Student's t
    (Efron 1969), so it rejects where t > c = z(1 - alpha/2) sqrt((n - 1) / (n - z^2)); at a
    true difference D, t is noncentral with delta = D / (s / sqrt(n)), and s / sqrt(n) is the
    bootstrap standard error x sqrt(n / (n - 1)) (the bootstrap's variance divides by n). The
    normal approximation (z(0.975) + z(0.8)) x se reached 77 % power at n = 50 and 60 % at
    n = 10 (benchmarks/report_coverage.py). NaN below MIN_CLUSTERS (6) clusters, where no
    sign-flip p-value (at least 2 / 2^n) is below 0.05. Holm's adjustment only raises it."""
    finite = spread[np.isfinite(spread)]
    if len(finite) < 2 or int(n) < MIN_CLUSTERS:
        return float("nan")
    from scipy import optimize, stats  # 0.9 s to import: a one-model report compares nothing

    z = NormalDist().inv_cdf(1 - ALPHA / 2)
    critical = z * np.sqrt((n - 1) / (n - z * z))
    delta = optimize.brentq(lambda d: stats.nct.sf(critical, n - 1, d) - power, 0, 100)
    return float(delta * np.std(finite, ddof=1) * np.sqrt(n / (n - 1)))


def _in_family(key: str, per_class: bool) -> bool:
    """Whether `key` is tested in the dataset table's family (exactly its columns) or in the
    per-class family."""
    return class_of(key) is not None if per_class else in_comparison(*record_name(key))


def verdicts(
    records: list[dict], dataset: str, comparisons: list[Comparison]
) -> dict[tuple[str, str], tuple[str, bool, float]]:
    """(task, metric) -> (best model, whether it beats the runner-up at alpha = 0.05 after Holm,
    the smallest difference their test detects with 80 % power), for the columns of `dataset`
    with two or more models and a test between the top two (the others are left unmarked)."""
    tests = {(c.task, c.metric, frozenset((c.model, c.other))): c for c in comparisons if c.dataset == dataset}
    out = {}
    for task, metric in {(r["task"], n) for r in records if r["dataset"] == dataset for n in r["metrics"]}:
        values = [
            (r["metrics"][metric], r["model"])
            for r in records
            if r["dataset"] == dataset and r["task"] == task and r["metrics"].get(metric) is not None
        ]
        if len(values) < 2:
            continue
        values.sort(key=lambda vm: vm[0], reverse=higher_is_better(metric))
        (best_value, best), (second_value, second) = values[0], values[1]
        test = tests.get((task, metric, frozenset((best, second))))
        if test is None:  # not compared (--baseline: two other models on top): left unmarked
            continue
        out[(task, metric)] = (best, best_value != second_value and test.p_holm < ALPHA, test.detectable)
    return out


def comparison_lines(comparisons: list[Comparison], dataset: str) -> list[str]:
    """The Markdown table of `dataset`'s paired comparisons, with each test's units (n; and
    clusters where they differ, as the dataset tables say it: markdown.sample_size)."""
    from training.report.markdown import plain

    rows = [c for c in comparisons if c.dataset == dataset]
    if not rows:
        return []
    lines = [
        "| metric | model | vs | n | difference [95 % CI] | p (sign-flip) | p (Holm) |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in rows:
        n = sample_size(c.n, c.n_clusters)
        lines.append(
            f"| {plain(c.task + '/' + c.metric)} | {plain(c.model)} | {plain(c.other)} | {n} | {comparison_cells(c)} |"
        )
    return lines


def comparison_cells(c: Comparison) -> str:
    """A comparison's `difference [low, high] | p | p (Holm)` cells; a tested difference of
    fewer than MIN_CLUSTERS clusters says why it has no interval; the difference alone, and n/a
    for the p-values, where there were no resamples (`--bootstrap 0`) or no test."""
    from training.report.markdown import with_interval

    if np.isfinite(c.low) and np.isfinite(c.high):
        difference = with_interval(c.difference, c.low, c.high)
    else:
        difference = with_interval(c.difference, note=c.note)
    return f"{difference} | {_p(c.p_value)} | {_p(c.p_holm)}"


def _p(value: float) -> str:
    return "n/a" if not np.isfinite(value) else f"{value:.4g}"


def forest_columns(records: list[dict], dataset: str) -> list[tuple[str, str]]:
    """The (task, metric) panels of `dataset`'s forest plot: its comparison's metrics with an
    interval (none: no plot)."""
    from training.report.markdown import comparison_columns

    return [
        (t, n)
        for t, n in comparison_columns(records, dataset)
        if any(
            (r.get("ci_low") or {}).get(n) is not None for r in records if r["dataset"] == dataset and r["task"] == t
        )
    ]


@plain_text  # model and metric names are drawn as written
def plot_forest(records: list[dict], dataset: str, path: Path) -> Path | None:
    """Each model's value with its 95 % interval, one panel per metric of `dataset`'s comparison
    (metrics without an interval are left out); None when there is nothing to draw."""
    from builders.viewer.plots import _figure
    from training.report.markdown import clusters

    cols = forest_columns(records, dataset)
    if not cols:
        return None
    models = list(dict.fromkeys(r["model"] for r in records if r["dataset"] == dataset and r["task"] != BLIND))
    fig = _figure(7.5, 0.5 + (0.3 * len(models) + 0.45) * len(cols))
    axes = fig.subplots(len(cols), 1, squeeze=False)[:, 0]
    for ax, (task, name) in zip(axes, cols, strict=True):
        rows = {r["model"]: r for r in records if r["dataset"] == dataset and r["task"] == task}
        for y, model in enumerate(models):
            r = rows.get(model)
            value = r["metrics"].get(name) if r else None
            low, high = ((r.get("ci_low") or {}).get(name), (r.get("ci_high") or {}).get(name)) if r else (None, None)
            if value is None or low is None or high is None:
                continue
            ax.errorbar([value], [y], xerr=[[value - low], [high - value]], fmt="o", capsize=3)
        ax.set_yticks(range(len(models)), models, fontsize=7)
        ax.set_ylim(-0.6, len(models) - 0.4)
        n = next((r["n_units"].get(name) for r in rows.values() if (r.get("n_units") or {}).get(name)), None)
        size = sample_size(n, clusters(list(rows.values()), name))
        ax.set_title(f"{task}/{name}, n = {size}", fontsize=8, loc="left")
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(f"{dataset}: value and 95 % bootstrap interval per model", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
