"""Coverage of the report's 95 % intervals (training/statistics.py `intervals`, the paired
difference of training/report/compare.py) at n = 10, 50 and 1,000 units, for each metric type:

- proportion: R@1 of images, each a hit with probability 0.05 (Clopper-Pearson);
- proportion, clustered: t2i R@K, 5 captions an image, an image's captions correlated (each
  image's hit probability drawn from Beta(0.6, 2.4), mean 0.2; Clopper-Pearson on the
  Korn-Graubard effective trials);
- proportion, clustered, at 6 clusters (`few_clusters`): the same at 6 images of 5 captions,
  Korn & Graubard's interval with their degrees-of-freedom factor (the report's) and without it
  (Clopper-Pearson on the effective trials alone, computed here with scipy.stats);
- paired difference of proportions: two models' R@1 on the same images, correlated (Newcombe's
  hybrid interval, training/statistics.py `newcombe`, via `paired_intervals`);
- bounded mean: ODmAP@k-like values in [0, 1], 70 % zeros (studentized bootstrap, clipped to
  [0, 1]; a sample of zeros only has no interval: all units equal);
- mean: an ITM delta mean, deltas exponential(1) (skewness 2), and lognormal(0, 1) (skewness
  6.2, a harsh case; studentized bootstrap);
- mean, clustered: 3 pairs a source image sharing a normal image effect plus exponential noise,
  n clusters (cluster studentized bootstrap);
- median: exponential(1) deltas, median ln 2 (percentile bootstrap);
- paired difference: two models on the same units, a - b with a = E1 + Z, b = 0.5 E2 + Z
  (E exponential, Z a shared normal unit effect), difference 0.5 (studentized on a - b);
- mean, real pairs: IR_r as training/evaluation.py computes it, each image i scored against the
  caption of its partner r(i) of the seeded derangement (`random_derangement(n, PAIR_SEED)`, the
  same for every repetition, as for every model), so unit i shares image r(i) with another unit;
  scores G(caption c, image i) = u_i + v_c + 0.02 a_c a_i + m_c [c = i] + noise (an image
  effect u, a caption effect v, an interaction, a skewed match effect m: 0.05 + exponential(0.05)),
  IR_r's population mean 0.12 (a t interval on the dyadic standard error of units that share
  an image and its Satterthwaite degrees of freedom, as the report makes it: `dyadic_t`). Each image's effect enters its two units with
  opposite signs and cancels in the mean: the pairs' own spread overstates the mean's, which the
  dyadic variance corrects. The adverse case, distinctive images (image i's score d_i higher
  with its own caption and -d_i with any other, d normal, sd 0.05; match 0.1, the population
  mean): the two units of an image then move together (taken as independent, they covered 84.5 %).

Each cell: the share of `--repetitions` seeded samples (default 400) whose interval holds the
population value, with its 95 % Wilson interval, and the intervals' mean width. `--resamples`
(default 1,000, the report's default) per interval. `--kind TEXT` and `--sizes N ...` run only
the metric types whose name holds TEXT at those n (one cell measured precisely).

Then the paired tests (training/report/compare.py, #50): their level, the share of
`--level-repetitions` seeded null samples (default 1,000; two models with equal means) that
`compare_dataset` rejects at 0.05, at n = 8, 20, 50 and 100 (`--level-sizes`), with its Wilson
interval, for per-unit differences that are skewed (Exp(1) - 1; lognormal(0, 1) - e^0.5,
skewness 6.2), clustered (3 pairs a source image sharing a normal effect, Exp(1) - 1 noise) and
real pairs linked by their derangement partners (two models of the *real pairs* rows above, each
its own draw: an image effect, and the adverse case). The repetitions are one column each of one
comparison, so they share its resamples, as a report's columns do. And the power at the printed
detectable difference (each test's own, compare.mean_tests): at n = 50 (`--power-size`), on pairs
a = E1 + Z + delta, b = E2 + Z (E exponential, Z a shared normal unit effect) and on the real
pairs with an image effect (A + delta, B): the share of `--power-repetitions` null samples
(default 1,000) that the test rejects at 0.05 (one test, so no Holm) once each is shifted by its
own printed d, once all are shifted by the mean printed d, and once each is shifted by the next
sample's printed d. The first checks the claim a report makes: d is computed from the sample's
own se and critical value (and t*), which a shift leaves unchanged, so "a true difference of d
would be detected 80 % of the time" is a claim conditional on that precision (Cox 1958, the two
measuring instruments). The other two mix samples of different precision: the second is the
power at the mean d, the third the mean power at a d printed for another sample; where the
test's critical value varies from sample to sample (the dyadic-t's empirical degrees of
freedom), neither is the power each sample claims.

Run: `python benchmarks/report_coverage.py [--repetitions N] [--resamples B]`; about 2.5
minutes of CPU without the power check (`--power-repetitions 0`). The tables go in
docs/report.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from counterfactory_metrics.itm_score_deltas.deltas import PAIR_SEED, random_derangement  # noqa: E402
from training.report.compare import compare_dataset  # noqa: E402
from training.statistics import UnitScores, intervals, paired_difference, paired_intervals  # noqa: E402
from training.unit_scores import delta_units  # noqa: E402

SIZES = (10, 50, 1000)


def _proportion(rng, n):
    return UnitScores("images", (rng.random(n) < 0.05).astype(float), proportion=True), 0.05


def _clustered_proportion(rng, n):
    p = rng.beta(0.6, 2.4, n)
    return UnitScores("images", rng.binomial(5, p).astype(float), np.full(n, 5.0), proportion=True), 0.2


def _mean(rng, n):
    return UnitScores("pairs", rng.exponential(1, n)), 1.0


def _skewed_mean(rng, n):
    return UnitScores("pairs", rng.lognormal(0, 1, n)), float(np.exp(0.5))


def _clustered_mean(rng, n):
    values = np.repeat(rng.normal(0, 1, n), 3) + rng.exponential(1, 3 * n)
    return UnitScores("pairs", values, clusters=np.repeat(np.arange(n), 3)), 1.0


def _median(rng, n):
    return UnitScores("pairs", rng.exponential(1, n), median=True), float(np.log(2))


def _difference(rng, n):
    shared = rng.normal(0, 1, n)
    a, b = (
        UnitScores("pairs", rng.exponential(1, n) + shared),
        UnitScores("pairs", 0.5 * rng.exponential(1, n) + shared),
    )
    return paired_difference(a, b), 0.5


def _real_pairs(rng, n):
    u, v, a = rng.normal(0, 0.05, n), rng.normal(0, 0.03, n), rng.normal(0, 1, n)
    match = 0.05 + rng.exponential(0.05, n)

    def score(c, i):  # G(caption c, image i)
        return u[i] + v[c] + 0.02 * a[c] * a[i] + np.where(c == i, match[c], 0) + rng.normal(0, 0.02, n)

    image, partner = np.arange(n), random_derangement(n, PAIR_SEED)
    scores = {"g_cr_ir": score(partner, partner), "g_cr_io": score(partner, image)}
    return delta_units(scores)["itm/IR_r_mean"], 0.1 + 0.02  # E[m] + 0.02 E[a^2]


def _distinctive_pairs(rng, n):
    d = rng.normal(0, 0.05, n)
    image, partner = np.arange(n), random_derangement(n, PAIR_SEED)

    def score(c, i):  # G(caption c, image i)
        return np.where(c == i, 0.1 + d[i], -d[i]) + rng.normal(0, 0.02, n)

    scores = {"g_cr_ir": score(partner, partner), "g_cr_io": score(partner, image)}
    return delta_units(scores)["itm/IR_r_mean"], 0.1


def _paired_proportions(rng, n):
    """Two models' R@1 on the same images, correlated through a shared draw z: A hits where
    z < 0.3, B where z < 0.2 on half the images and independently with 0.2 on the others;
    the difference 0.1 (Newcombe's hybrid, `statistics.newcombe`)."""
    z = rng.random(n)
    b = np.where(rng.random(n) < 0.5, z < 0.2, rng.random(n) < 0.2)
    return (
        UnitScores("images", (z < 0.3).astype(float), proportion=True),
        UnitScores("images", b.astype(float), proportion=True),
    ), 0.1


def _bounded_mean(rng, n):
    """ODmAP@k-like: 70 % of the queries score 0, the others Beta(2, 2); mean 0.15, in [0, 1]
    (studentized, clipped to [0, 1])."""
    values = np.where(rng.random(n) < 0.7, 0.0, rng.beta(2, 2, n))
    return UnitScores("queries", values, bounds=(0, 1)), 0.15


KINDS = {
    "proportion (R@1, p = 0.05)": _proportion,
    "proportion, clustered (t2i, 5 captions an image)": _clustered_proportion,
    "mean (exponential deltas)": _mean,
    "mean (lognormal deltas)": _skewed_mean,
    "mean, clustered (3 pairs a source image)": _clustered_mean,
    "median (exponential deltas)": _median,
    "paired difference of means": _difference,
    "mean, real pairs (IR_r, a derangement partner)": _real_pairs,
    "mean, real pairs (IR_r, distinctive images: the adverse case)": _distinctive_pairs,
    "paired difference of proportions (R@1 of two models)": _paired_proportions,
    "bounded mean (ODmAP-like, 70 % zeros)": _bounded_mean,
}


def coverage(make, n: int, repetitions: int, resamples: int) -> tuple[int, int, float]:
    """(covered, repetitions with an interval, their mean width) of `make`'s metric at n units
    (clusters)."""
    rng = np.random.default_rng(n)
    covered = counted = 0
    width = 0.0
    for rep in range(repetitions):
        metric, truth = make(rng, n)
        found = (paired_intervals if isinstance(metric, tuple) else intervals)({"m": metric}, resamples, rep)["m"]
        if np.isfinite(found.low):
            counted += 1
            covered += found.low <= truth <= found.high
            width += found.high - found.low
    return covered, counted, width / max(counted, 1)


def _percent(hits: int, total: int) -> str:
    ci = stats.binomtest(hits, total).proportion_ci(method="wilson")
    return f"{100 * hits / total:.1f} % [{100 * ci.low:.1f}, {100 * ci.high:.1f}]"


# --- The paired tests' level and power (#50) ------------------------------------------------------


def _against_zero(draw):
    """Model A's units `draw(rng, n)` (mean 0) against a model B scoring 0 on every unit."""
    return lambda rng, n: (UnitScores("pairs", draw(rng, n)), UnitScores("pairs", np.zeros(n)))


def _clustered_null(rng, n):
    clusters = np.repeat(np.arange(n), 3)
    values = np.repeat(rng.normal(0, 1, n), 3) + rng.exponential(1, 3 * n) - 1
    return UnitScores("pairs", values, clusters=clusters), UnitScores("pairs", np.zeros(3 * n), clusters=clusters)


def _two_models(make):
    """Two models of one of the coverage's real-pair kinds, each its own draw: equal means."""
    return lambda rng, n: (make(rng, n)[0], make(rng, n)[0])


def _shared_effect(rng, n):
    shared = rng.normal(0, 1, n)
    return UnitScores("pairs", rng.exponential(1, n) + shared), UnitScores("pairs", rng.exponential(1, n) + shared)


NULLS = {
    "skewed (Exp(1) - 1)": _against_zero(lambda rng, n: rng.exponential(1, n) - 1),
    "skewed (lognormal(0, 1) - e^0.5)": _against_zero(lambda rng, n: rng.lognormal(0, 1, n) - np.exp(0.5)),
    "clustered (3 pairs a source image, Exp(1) - 1 noise)": _clustered_null,
    "real pairs (IR_r), an image effect": _two_models(_real_pairs),
    "real pairs (IR_r), the adverse case": _two_models(_distinctive_pairs),
}
POWER_KINDS = {"paired (a = E1 + Z + delta, b = E2 + Z)": _shared_effect, **dict(list(NULLS.items())[3:4])}
LEVEL_SIZES = (8, 20, 50, 100)


def _compared(pairs: list, resamples: int, seed: int) -> list:
    """compare_dataset of models A and B, one column per (A, B) of `pairs` (one Holm family,
    unused: each p-value is read alone)."""
    units = {m: {f"itm/IR_c_mean_{k}": pair[i] for k, pair in enumerate(pairs)} for i, m in enumerate("AB")}
    return compare_dataset("tests", units, ["A", "B"], resamples, seed)


def level(make, n: int, repetitions: int, resamples: int) -> tuple[int, int]:
    """(rejections at 0.05, tests made) of `repetitions` seeded null samples of n units (clusters)."""
    rng = np.random.default_rng(n)
    tests = _compared([make(rng, n) for _ in range(repetitions)], resamples, 0)
    return sum(c.p_value < 0.05 for c in tests), sum(bool(np.isfinite(c.p_value)) for c in tests)


def power(make, n: int, repetitions: int, resamples: int) -> tuple[float, int, int, int]:
    """(delta, rejected at delta, at its own d, at another's d) of `repetitions` seeded null
    samples of n units: delta their mean printed detectable difference, and how often the test
    rejects once model A is delta above B, once each sample's A is its own printed d above B, and
    once it is the next sample's printed d above B (a d drawn independently of the sample)."""
    rng = np.random.default_rng(n)
    pairs = [make(rng, n) for _ in range(repetitions)]
    found = np.array([c.detectable for c in _compared(pairs, resamples, 0)])
    delta, found = float(np.nanmean(found)), np.nan_to_num(found)
    rejected = []
    for shift in (np.full(len(pairs), delta), found, np.roll(found, 1)):
        shifted = [(dataclasses.replace(a, num=a.num + d), b) for (a, b), d in zip(pairs, shift, strict=True)]
        rejected.append(sum(c.p_value < 0.05 for c in _compared(shifted, resamples, 1)))
    return delta, *rejected


def tests_section(args) -> None:
    """Print the level table and the power lines (module docstring)."""
    if args.level_repetitions:
        print(f"\nlevel of the paired tests at 0.05, {args.level_repetitions} seeded null samples a cell")
        print("(rejected % [95 % Wilson interval])\n")
        print("| null | " + " | ".join(f"n = {n:,}" for n in args.level_sizes) + " |")
        print("|---|" + "---|" * len(args.level_sizes))
        for name, make in NULLS.items():
            cells = [level(make, n, args.level_repetitions, args.resamples) for n in args.level_sizes]
            print(f"| {name} | " + " | ".join(_percent(*cell) if cell[1] else "n/a" for cell in cells) + " |")
    for name, make in POWER_KINDS.items() if args.power_repetitions else ():
        delta, at_mean, at_own, at_other = power(make, args.power_size, args.power_repetitions, args.resamples)
        total = args.power_repetitions
        print(f"\npower at n = {args.power_size}, {name}, {total} seeded repetitions,")
        print(f"rejected at 0.05 (target: 80 %): at its own printed d {_percent(at_own, total)};")
        print(f"at the mean printed d, {delta:.4g}, {_percent(at_mean, total)}; at the next sample's d")
        print(f"{_percent(at_other, total)}")


def few_clusters(repetitions: int, clusters: int = 6) -> tuple[int, int, int]:
    """(repetitions, covered by the report's interval, covered without Korn & Graubard's
    degrees-of-freedom factor) of t2i R@K at `clusters` images of 5 captions (`_clustered_proportion`);
    the interval without the factor is Clopper-Pearson on trials / design effect, by hand."""
    rng = np.random.default_rng(clusters)
    report = plain = 0
    for _ in range(repetitions):
        metric, truth = _clustered_proportion(rng, clusters)
        found = intervals({"m": metric}, 0, 0)["m"]
        report += found.low <= truth <= found.high
        hits, trials = metric.num, metric.den
        p = hits.sum() / trials.sum()
        if 0 < p < 1:
            residual = hits - p * trials
            variance = (residual**2).sum() * clusters / (clusters - 1) / trials.sum() ** 2
            n_eff = trials.sum() / max(1.0, variance / (p * (1 - p) / trials.sum()))
        else:
            n_eff = float(clusters)
        x = p * n_eff
        low = stats.beta.ppf(0.025, x, n_eff - x + 1) if x > 0 else 0.0
        high = stats.beta.ppf(0.975, x + 1, n_eff - x) if x < n_eff else 1.0
        plain += low <= truth <= high
    return repetitions, report, plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repetitions", type=int, default=400)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--kind", default="", help="only the metric types whose name holds this text")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--level-repetitions", type=int, default=1000, help="0: no level table")
    parser.add_argument("--level-sizes", type=int, nargs="+", default=list(LEVEL_SIZES))
    parser.add_argument("--power-repetitions", type=int, default=1000, help="0: no power simulation")
    parser.add_argument("--power-size", type=int, default=50)
    parser.add_argument("--few-clusters-repetitions", type=int, default=1000, help="0: no 6-cluster check")
    args = parser.parse_args()
    start = time.process_time()
    print(f"coverage of the 95 % intervals, {args.repetitions} seeded repetitions, {args.resamples} resamples")
    print("(covered % [95 % Wilson interval]; mean width)")
    print()
    print("| metric type | " + " | ".join(f"n = {n:,}" for n in args.sizes) + " |")
    print("|---|" + "---|" * len(args.sizes))
    for name, make in KINDS.items():
        if args.kind not in name:
            continue
        cells = []
        for n in args.sizes:
            covered, counted, width = coverage(make, n, args.repetitions, args.resamples)
            cells.append(f"{_percent(covered, counted)}; {width:.3g}" if counted else "n/a")
            if counted < args.repetitions:
                cells[-1] += f" ({args.repetitions - counted} without an interval)"
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.few_clusters_repetitions:
        total, report, plain = few_clusters(args.few_clusters_repetitions)
        print()
        print(f"proportion, clustered, at 6 clusters of 5 ({total} seeded repetitions): Korn & Graubard's interval")
        print(
            f"covers {_percent(report, total)} with their degrees-of-freedom factor, {_percent(plain, total)} without"
        )
    tests_section(args)
    print()
    print(f"CPU time {time.process_time() - start:.0f} s")


if __name__ == "__main__":
    main()
