"""Coverage of the report's 95 % intervals (training/statistics.py `intervals`, the paired
difference of training/report/compare.py) at n = 10, 50 and 1,000 units, for each metric type:

- proportion: R@1 of images, each a hit with probability 0.05 (Clopper-Pearson);
- proportion, clustered: t2i R@K, 5 captions an image, an image's captions correlated (each
  image's hit probability drawn from Beta(0.6, 2.4), mean 0.2; Clopper-Pearson on the
  Korn-Graubard effective trials);
- mean: an ITM delta mean, deltas exponential(1) (skewness 2), and lognormal(0, 1) (skewness
  6.2, a harsh case; studentized bootstrap);
- mean, clustered: 3 pairs a source image sharing a normal image effect plus exponential noise,
  n clusters (cluster studentized bootstrap);
- median: exponential(1) deltas, median ln 2 (percentile bootstrap);
- paired difference: two models on the same units, a - b with a = E1 + Z, b = 0.5 E2 + Z
  (E exponential, Z a shared normal unit effect), difference 0.5 (studentized on a - b).

Each cell: the share of `--repetitions` seeded samples (default 400) whose interval holds the
population value, with its 95 % Wilson interval. `--resamples` (default 1,000, the report's
default) per interval. Run: `python benchmarks/report_coverage.py [--repetitions N] [--resamples B]`;
about two minutes on 2 cores. The table goes in docs/report.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.statistics import UnitScores, intervals, paired_difference  # noqa: E402

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


KINDS = {
    "proportion (R@1, p = 0.05)": _proportion,
    "proportion, clustered (t2i, 5 captions an image)": _clustered_proportion,
    "mean (exponential deltas)": _mean,
    "mean (lognormal deltas)": _skewed_mean,
    "mean, clustered (3 pairs a source image)": _clustered_mean,
    "median (exponential deltas)": _median,
    "paired difference of means": _difference,
}


def coverage(make, n: int, repetitions: int, resamples: int) -> tuple[int, int]:
    """(covered, repetitions with an interval) of `make`'s metric at n units (clusters)."""
    rng = np.random.default_rng(n)
    covered = counted = 0
    for rep in range(repetitions):
        metric, truth = make(rng, n)
        found = intervals({"m": metric}, resamples, rep)["m"]
        if np.isfinite(found.low):
            counted += 1
            covered += found.low <= truth <= found.high
    return covered, counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repetitions", type=int, default=400)
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args()
    start = time.process_time()
    print(f"coverage of the 95 % intervals, {args.repetitions} seeded repetitions, {args.resamples} resamples")
    print()
    print("| metric type | " + " | ".join(f"n = {n:,}" for n in SIZES) + " |")
    print("|---|" + "---|" * len(SIZES))
    for name, make in KINDS.items():
        cells = []
        for n in SIZES:
            covered, counted = coverage(make, n, args.repetitions, args.resamples)
            ci = stats.binomtest(covered, counted).proportion_ci(method="wilson") if counted else None
            cells.append(f"{100 * covered / counted:.1f} % [{100 * ci.low:.1f}, {100 * ci.high:.1f}]" if ci else "n/a")
            if counted < args.repetitions:
                cells[-1] += f" ({args.repetitions - counted} without an interval)"
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    print(f"CPU time {time.process_time() - start:.0f} s")


if __name__ == "__main__":
    main()
