"""Paired comparisons of the models of one report, on the same units (training/statistics.py).

For every two models (or every model against `--baseline`) and every metric of a dataset's
comparison table that both scored with units: the difference, its 95 % paired interval
(statistics.paired_intervals; unadjusted) and the p-value of the test dual to it (`mean_tests` of
a difference in means, `newcombe_tests` of two proportions) or of the sign-flip test (a median, a
mean over groups; none where untested), Holm-adjusted across exactly
the tests of the table's columns; the per-class metrics (ODmAP@k and PN per removed class) are a
family of their own (`per_class=True`), on each class's units. `verdicts` tells the table which
best value beats its runner-up at alpha = 0.05 (bold); failing to reject is no equivalence.
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
from training.report.per_class import class_of
from training.report.results import record_name
from training.statistics import (
    ALPHA,
    FEW_CLUSTERS,
    MIN_CLUSTERS,
    UnitScores,
    bootstrap,
    bootstrap_t,
    difference_interval,
    dyadic_df,
    holm,
    newcombe,
    paired_difference,
    paired_intervals,
    robust_se,
    unit_sets,
    working_df,
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
    test: str = ""  # bootstrap-t (a difference in means), sign-flip (exchangeable scores), "" (none)
    note: str | None = None  # why there is no test (too few clusters) or no interval (statistics.Interval.note)

    def as_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in vars(self).items()}


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
    metrics; those untested (statistics.paired_intervals' note: fixed, all units equal, ...; or
    fewer than MIN_CLUSTERS clusters, where no sign-flip p-value, at least 2 / 2^n, reaches 0.05)
    have no p-value (NaN: outside the family) and say why (`note`)."""
    scored = [m for m in models if m in units]
    against = [(m, baseline) for m in scored if m != baseline]  # every model against --baseline
    pairs = list(itertools.combinations(scored, 2)) if baseline is None else against
    keys = sorted(set.intersection(*(set(units[m]) for m in {x for p in pairs for x in p})) if pairs else [])
    keys = sorted(
        (k for k in keys if record_name(k) and _in_family(k, per_class)),
        key=lambda k: tuple(map(natural, record_name(k))),
    )
    paired = {(key, a, b): (units[a][key], units[b][key]) for key in keys for a, b in pairs}
    # Two proportions get Newcombe's interval, another difference linear in the units the
    # studentized one, a median's or a mean over groups' the percentile interval of the paired
    # resampled differences; each missing one says why, and so does each pair left untested.
    found = paired_intervals(paired, resamples, seed)
    notes = {k: found[k].note or (FEW_CLUSTERS if found[k].n_clusters < MIN_CLUSTERS else None) for k in paired}
    live = {k: pair for k, pair in paired.items() if notes[k] is None}
    resampled = bootstrap({(m, k): units[m][k] for (k, a, b) in live for m in (a, b)}, resamples, seed)
    differences = {k: paired_difference(*pair) for k, pair in live.items()}
    both = {k for k, (a, b) in live.items() if differences[k] and a.proportion and b.proportion}
    means = mean_tests({k: d for k, d in differences.items() if d and k not in both}, resamples, seed)
    means |= newcombe_tests({k: live[k] for k in both})
    flips = sign_flip_pvalues({k: pair for k, pair in live.items() if not differences[k]}, resamples, seed)
    out = []
    for k, (ua, ub) in paired.items():
        (key, a, b), (n, clusters), nan = k, ua.counted(), float("nan")
        spread = resampled[(a, key)] - resampled[(b, key)] if k in live else np.full(1, nan)
        low, high = difference_interval(found[k], spread) if k in live else (nan, nan)
        p, _, least, test = means.get(k) or _sign_flip(flips.get(k, nan), spread, n)
        c = Comparison(dataset, *record_name(key), a, b, ua.value() - ub.value(), low, high, p, nan, n, clusters)
        bottom, top = ua.limits()  # no detectable difference beyond the range
        c.detectable, c.test, c.note = least if least <= top - bottom else nan, test, notes[k]
        out.append(c)
    for c, p in zip(out, holm([c.p_value for c in out]), strict=True):
        c.p_holm = float(p)
    return out


def _sign_flip(p: float, spread: np.ndarray, n: int) -> tuple[float, float, float, str]:
    """(p, se, detectable, "sign-flip") of a sign-flip test (p NaN: none), a monotone function of
    Student's t (Efron 1969): t > z sqrt((n - 1) / (n - z^2)), se the bootstrap's x sqrt(n / (n - 1)),
    `detectable` on n - 1 df."""
    finite, z = spread[np.isfinite(spread)], NormalDist().inv_cdf(1 - ALPHA / 2)
    if not np.isfinite(p) or len(finite) < 2:
        return p, np.nan, np.nan, ""
    se = np.std(finite, ddof=1) * np.sqrt(n / (n - 1))
    return p, se, detectable(se, n - 1, z * np.sqrt((n - 1) / (n - z * z))), "sign-flip"


def mean_tests(differences: dict, resamples: int, seed: int) -> dict:
    """key -> (p, se, detectable difference, test) of "the difference in means is 0" for each
    paired difference, the dual of its interval: the bootstrap-t test (Hall & Wilson 1991), t =
    difference / se against the t* of the studentized interval's resamples (statistics.bootstrap_t,
    on clusters), p = min(1, 2 min(#{t* <= t} + 1, #{t* >= t} + 1) / (B + 1)); with `partners`
    (real pairs) the dyadic-t test, t against Student's t on statistics.dyadic_df. The detectable
    difference D is each test's own: the bootstrap-t's from the same t*, taken as the studentized
    statistic's distribution under a shift too (Davison & Hinkley 1997, §4.6), so t* + D / se
    leaves the test's band [t*_0.025, t*_0.975] with probability POWER: D = se (t*_0.975 -
    t*_0.2) for a rise, se (t*_0.8 - t*_0.025) for a fall, the larger; the dyadic-t's
    `detectable` on its critical value and the working model's df (statistics.working_df), the
    se's spread under independent clusters (the smaller df sets only the test's critical value).
    None without resamples."""
    from scipy import special

    out: dict = {}
    linked = {k for k, d in differences.items() if d.partners is not None} if resamples else set()
    for key in linked:
        d = differences[key]
        se = robust_se(d)
        if se > 0:
            working = working_df(d)  # the df's working model's, and the detectable difference's
            df = dyadic_df(d, working)
            p = 2 * special.stdtr(df, -abs(d.value() / se))
            critical = float(special.stdtrit(df, 1 - ALPHA / 2))
            out[key] = (float(p), se, detectable(se, working, critical), "dyadic-t")
    for names in unit_sets({k: d for k, d in differences.items() if k not in linked}).values():
        for key, (value, se, t) in bootstrap_t({k: differences[k] for k in names}, resamples, seed).items():
            if len(t) and se > 0:
                tails = np.count_nonzero(t <= value / se), np.count_nonzero(t >= value / se)
                low, high, fall, rise = np.quantile(t, [ALPHA / 2, 1 - ALPHA / 2, 1 - POWER, POWER])
                p = min(1.0, 2 * (min(tails) + 1) / (len(t) + 1))
                out[key] = (p, se, float(se * max(high - fall, rise - low)), "bootstrap-t")
    return out


def newcombe_tests(pairs: dict) -> dict:
    """key -> (p, se, detectable, "newcombe") of two proportions on the same units: the test
    dual to their statistics.newcombe interval, p the alpha at which its 1 - alpha interval's end
    nearest 0 is 0 (root-found, 1e-12 to 1 - 1e-6, then 1), se its 95 % half-width on that side
    over z, `detectable` on z and infinite df (the interval is on the Korn-Graubard effective trials)."""
    from scipy import optimize

    out, z = {}, NormalDist().inv_cdf(1 - ALPHA / 2)
    for key, (a, b) in pairs.items():
        d = a.value() - b.value()
        end = lambda alpha: np.sign(d) * newcombe(a, b, 1 - alpha)[int(d < 0)]  # noqa: E731, B023
        low, high = 1e-12, 1 - 1e-6  # end(alpha) > 0: the 1 - alpha interval excludes 0
        p = 1.0 if d == 0 or end(high) <= 0 else low if end(low) >= 0 else optimize.brentq(end, low, high)
        se = abs(d - newcombe(a, b)[int(d < 0)]) / z
        out[key] = (float(p), se, detectable(se, np.inf, z), "newcombe")
    return out


def detectable(se: float, df: float, critical: float, power: float = POWER) -> float:
    """The smallest true difference that a test rejecting where |difference| / se > `critical`
    detects with `power`, its statistic taken as noncentral t with delta = D / se on the se's
    `df` (the tests' own: `mean_tests`, `newcombe_tests`, `_sign_flip`); NaN untested. Holm's
    adjustment only raises it. Power checked in benchmarks/report_coverage.py."""
    if not (np.isfinite(se) and se > 0 and np.isfinite(critical) and df >= 1):
        return float("nan")
    from scipy import optimize, stats  # 0.9 s to import: a one-model report compares nothing

    delta = optimize.brentq(lambda d: stats.nct.sf(critical, df, d) - power, 0, 100)
    return float(delta * se)


def _in_family(key: str, per_class: bool) -> bool:
    """Whether `key` is tested in the dataset table's family (exactly its columns) or in the
    per-class family."""
    return class_of(key) is not None if per_class else in_comparison(*record_name(key))


def verdicts(
    records: list[dict], dataset: str, comparisons: list[Comparison]
) -> dict[tuple[str, str], tuple[str, bool, float, str | None]]:
    """(task, metric) -> (best model, whether it beats the runner-up at alpha = 0.05 after Holm,
    the smallest difference their test detects with 80 % power, why they were not tested), for
    the columns of `dataset` with two or more models compared (the others are left unmarked)."""
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
        out[(task, metric)] = (best, best_value != second_value and test.p_holm < ALPHA, test.detectable, test.note)
    return out


def comparison_lines(comparisons: list[Comparison], dataset: str) -> list[str]:
    """The Markdown table of `dataset`'s paired comparisons, with each test's units (n; and
    clusters where they differ, as the dataset tables say it: markdown.sample_size)."""
    from training.report.markdown import plain

    rows = [c for c in comparisons if c.dataset == dataset]
    if not rows:
        return []
    lines = [
        "| metric | model | vs | n | difference [95 % CI] | test | p | p (Holm) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in rows:
        n = sample_size(c.n, c.n_clusters)
        lines.append(
            f"| {plain(c.task + '/' + c.metric)} | {plain(c.model)} | {plain(c.other)} | {n} | {comparison_cells(c)} |"
        )
    return lines


def comparison_cells(c: Comparison) -> str:
    """A comparison's `difference [low, high] | test | p | p (Holm)` cells; an untested one says
    why (its `note`), and n/a for the p-values, as where there were no resamples
    (`--bootstrap 0`)."""
    from training.report.markdown import with_interval

    finite = np.isfinite(c.low) and np.isfinite(c.high)
    difference = with_interval(c.difference, c.low, c.high) if finite else with_interval(c.difference, note=c.note)
    return f"{difference} | {c.test or 'none'} | {_p(c.p_value)} | {_p(c.p_holm)}"


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
