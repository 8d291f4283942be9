"""Level and power at 0.05 of the tests of a mean that the report could use, on skewed nulls.

The report tests a difference in means with the equal-tailed bootstrap-t (training/report/
compare.py `mean_tests`, Hall & Wilson 1991). On the lognormal(0, 1) - e^0.5 null (skewness 6.2)
it rejects about 10 % at n = 8 (benchmarks/report_coverage.py, docs/report.md). This benchmark
measures, on the same one-sample nulls (Exp(1) - 1 and that lognormal, mean 0), the alternatives
a reviewer would name, each written here in numpy/scipy independently of the report's code, and
their power on a symmetric alternative (so that a test conservative by construction shows):

- `bootstrap-t`: the report's test (t* = (mean* - mean) / max(se*, 0.1 se), equal-tailed p);
- `double bootstrap`: its p calibrated by a second level (Beran 1988, JASA 83:687-697;
  Davison & Hinkley 1997, §4.5), 99 inner resamples;
- `wild, Mammen` / `sign-flip`: the wild bootstrap of the studentized mean under the null with
  Mammen's (1993) two-point weights / Rademacher weights (Janssen 1997);
- `Student t`: the one-sample t-test;
- `EL`: empirical likelihood, -2 log R(0) against chi2(1) (Owen 1988, Biometrika 75:237-249);
- `Bartlett EL`: -2 log R / (1 + a/n), a = m4 / (2 m2^2) - m3^2 / (3 m2^3) from the sample's
  central moments (DiCiccio, Hall & Romano 1991, Annals of Statistics 19:1053-1061);
- `bootstrap-calibrated EL`: -2 log R(0) against the same statistic of B resamples at their
  source's mean (Owen 1988, §4; Owen 2001, *Empirical Likelihood*, Chapman & Hall, §3.3);
- `adjusted EL`: EL with the pseudo-point -a_n mean, a_n = max(1, log(n) / 2) (Chen, Variyath &
  Abraham 2008, Journal of Computational and Graphical Statistics 17:426-443), chi2(1);
- `balanced augmented EL`: EL with the two points 0 - s sd u and 2 mean + s sd u, u = sign(mean),
  s = 1.9 (Emerson & Owen 2009, Electronic Journal of Statistics 3:1161-1192), against chi2(1)
  and (`, F`) against F(1, n - 1), i.e. t(n-1)^2;
- `tilted bootstrap`: resampling from the exponentially tilted EDF of mean 0, w_i ~ exp(tau x_i)
  (Efron 1981, Canadian Journal of Statistics 9:139-158; DiCiccio & Romano 1990, International
  Statistical Review 58:59-76; Davison & Hinkley 1997, §4.4), the studentized mean, equal-tailed p; where 0 lies
  outside the sample's hull no distribution on the sample has mean 0 and p = 1/(B+1) (rejected,
  as EL's infinite -2 log R);
- `stabilised bootstrap-t`: Tibshirani (1988, Biometrika 75:433-444): 100 resamples, each with a
  25-resample bootstrap se; a least-squares line of log se on the mean (in place of his
  running-lines smoother) gives g(u) = int_0^u exp(-a - b v) dv; g(mean*) - g(mean) of B fresh
  resamples against g(mean) - g(0), equal-tailed;
- `Johnson t` / `Chen t`: t + k (1 + 2 t^2) with k = g / (6 sqrt(n)) (Johnson 1978, JASA
  73:536-544) and t + k (1 + 2 t^2) + 4 k^2 (t + 2 t^3) (Chen 1995, JASA 90:767-772), g =
  m3 / s^3, against t(n - 1).

No test of a mean can hold its level over every distribution with a finite variance (Bahadur &
Savage 1956, Annals of Mathematical Statistics 27:1115-1122). At n = 8 the lognormal sample lies
wholly below 0 with probability (1 - P(Z > 0.5))^8 = 5.2 %; the EL, Bartlett and tilted tests
reject all of those by construction.

Run: `python benchmarks/mean_test_alternatives.py [--repetitions 1000] [--sizes 8 20 50 100]
[--tests EL "Student t"]`. Rejected % at 0.05 with the 95 % Wilson interval.

Measured with `--repetitions 2000` (18 CPU minutes, most of it the double bootstrap): %
rejected at 0.05 on Exp(1) - 1 and on the lognormal at n = 8 / 20 / 50 / 100, then the power on
N(0.8, 1) at n = 8 and N(0.4, 1) at n = 50 (the reference: Student t, exact on a normal). The Wilson
half-width is about 1.0 point at 6 %, 1.6 at 15 %, 2.2 at 50 %. The Exp n = 100 set of samples
runs high (Student t 7.0 %; 5.9 % on 20,000 other samples). `balanced augmented EL, s = 3`: the
tuning that brings BAEL nearest the lognormal's 6 %, at the cost of its power.

test                         | Exp(1) - 1          | lognormal - e^0.5   | power
bootstrap-t                  |  6.0  4.7  5.3  6.0 | 10.2  7.0  7.0  5.3 | 43.0 79.6
double bootstrap             |  9.4  5.5  6.0  7.0 | 12.1  8.0  7.5  5.7 | 52.1 80.9
wild, Mammen                 | 18.4 10.7  8.4  7.4 | 22.2 16.9 11.6  8.1 | 72.5 83.5
sign-flip                    |  9.7  7.5  7.2  6.8 | 14.3 13.8 10.8  8.8 | 45.9 79.4
Student t                    | 11.4  7.6  7.1  7.0 | 16.4 13.8 11.0  8.9 | 50.3 81.1
EL                           | 16.1  8.3  6.8  6.7 | 20.5 12.9 10.2  6.8 | 69.0 81.9
Bartlett EL                  | 14.2  7.3  6.5  6.4 | 18.9 11.7  8.9  6.5 | 66.0 81.2
bootstrap-calibrated EL      |  7.8  5.0  5.6  6.0 | 11.2  8.2  6.5  5.4 | 41.9 79.7
adjusted EL                  | 10.0  5.8  5.9  6.0 | 14.1 10.0  8.4  6.2 | 49.5 79.3
balanced augmented EL        |  8.0  5.2  5.7  6.0 | 12.3  9.8  8.1  6.4 | 35.8 79.2
balanced augmented EL, F     |  4.3  3.6  5.0  5.7 |  8.1  8.3  7.2  6.2 | 15.3 77.2
tilted bootstrap             | 14.4  7.0  5.8  6.2 | 18.4 11.1  8.5  5.9 | 62.9 79.6
stabilised bootstrap-t       | 13.6  8.1  6.5  6.4 | 20.8 13.2 10.9  6.8 | 63.7 81.4
Johnson t                    |  7.3  4.8  5.5  6.0 | 10.7  6.8  6.8  5.3 | 47.2 80.5
Chen t                       | 10.4  7.3  6.6  7.0 | 14.8 12.0 10.8  7.6 | 51.7 80.6
balanced augmented EL, s = 3 |  3.7  2.7  3.6  4.6 |  6.8  6.0  6.1  4.9 | 10.8 70.3

None holds <= 6 % at every n on the lognormal; those nearest it at n = 8 (BAEL with F or s = 3)
have a fifth to a third of Student t's power there.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
from scipy import optimize, special, stats

NULLS = {
    "Exp(1) - 1": lambda rng, shape: rng.exponential(1, shape) - 1,
    "lognormal(0, 1) - e^0.5": lambda rng, shape: rng.lognormal(0, 1, shape) - np.exp(0.5),
}
#: Power: (name, n, mean) of normal alternatives with sd 1.
ALTERNATIVES = (("N(0.8, 1)", 8, 0.8), ("N(0.4, 1)", 50, 0.4))
MAMMEN = ((np.sqrt(5) + 1) / (2 * np.sqrt(5)), -(np.sqrt(5) - 1) / 2, (np.sqrt(5) + 1) / 2)


def _t(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return x.mean(-1), x.std(-1, ddof=1) / np.sqrt(x.shape[-1])


def _p(t: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """Equal-tailed two-sided p of `observed` against the last axis of `t`, as the report's."""
    low, high = (t <= observed[..., None]).sum(-1), (t >= observed[..., None]).sum(-1)
    return np.minimum(1, 2 * (np.minimum(low, high) + 1) / (t.shape[-1] + 1))


def per_sample(test: Callable) -> Callable:
    """A resampling test of one sample, run on each row of `x`."""
    return lambda x, rng, b: np.array([test(row, rng, b) for row in x])


@per_sample
def bootstrap_t(x: np.ndarray, rng: np.random.Generator, b: int) -> float:
    (m, s), (ms, ss) = _t(x), _t(x[rng.integers(0, len(x), (b, len(x)))])
    return float(_p((ms - m) / np.maximum(ss, 0.1 * s), np.array(m / s)))


@per_sample
def double_bootstrap(x: np.ndarray, rng: np.random.Generator, b: int, inner: int = 99) -> float:
    n, (m, s) = len(x), _t(x)
    outer = x[rng.integers(0, n, (b, n))]
    ms, ss = _t(outer)
    ss = np.maximum(ss, 0.1 * s)
    p = _p((ms - m) / ss, np.array(m / s))
    again = np.take_along_axis(outer[:, None, :], rng.integers(0, n, (b, inner, n)), -1)
    m2, s2 = _t(again)
    p_outer = _p((m2 - ms[:, None]) / np.maximum(s2, 0.1 * ss[:, None]), (ms - m) / ss)
    return float(((p_outer <= p).sum() + 1) / (b + 1))


def wild(mammen: bool) -> Callable:
    def test(x: np.ndarray, rng: np.random.Generator, b: int) -> float:
        low_share, low, high = MAMMEN if mammen else (0.5, -1.0, 1.0)
        mw, sw = _t(x * np.where(rng.random((b, len(x))) < low_share, low, high))
        m, s = _t(x)
        return float(_p(mw / np.maximum(sw, 1e-300), np.array(m / s)))

    return per_sample(test)


@per_sample
def tilted_bootstrap(x: np.ndarray, rng: np.random.Generator, b: int) -> float:
    if x.min() >= 0 or x.max() <= 0:
        return 1 / (b + 1)
    scale = x.std()
    tau = optimize.brentq(lambda t: special.softmax(t * x / scale) @ x, -1e4, 1e4, xtol=1e-12)
    cum = np.cumsum(special.softmax(tau * x / scale))
    star = x[np.minimum(np.searchsorted(cum, rng.random((b, len(x))) * cum[-1]), len(x) - 1)]
    (m, s), (ms, ss) = _t(x), _t(star)
    return float(_p(ms / np.maximum(ss, 1e-300), np.array(m / s)))


@per_sample
def stabilised_bootstrap_t(x: np.ndarray, rng: np.random.Generator, b: int) -> float:
    n, m = len(x), x.mean()
    outer = x[rng.integers(0, n, (100, n))]
    inner = np.take_along_axis(outer[:, None, :], rng.integers(0, n, (100, 25, n)), -1)
    se = inner.mean(-1).std(-1, ddof=1)
    keep = se > 0
    slope, intercept = np.polyfit(outer.mean(-1)[keep], np.log(se[keep]), 1)

    def g(u: np.ndarray) -> np.ndarray:  # the integral of 1 / se, exactly, for a log-linear se
        with np.errstate(over="ignore"):
            return np.exp(-intercept) * (u if slope == 0 else -np.expm1(-slope * u) / slope)

    star = x[rng.integers(0, n, (b, n))].mean(-1)
    return float(_p(g(star) - g(m), np.array(g(m) - g(0.0))))


def el_statistic(g: np.ndarray) -> np.ndarray:
    """-2 log R of mean 0 for each row of `g` (Owen 1988): 2 sum log(1 + lam g_i) with
    sum g_i / (1 + lam g_i) = 0, solved by bisection; inf where 0 is outside the row's hull."""
    inside = (g.min(-1) < 0) & (g.max(-1) > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lo = np.where(inside, -1 / g.max(-1), 0.0)
        hi = np.where(inside, -1 / g.min(-1), 0.0)
        for _ in range(200):  # sum g / (1 + lam g) falls in lam on (lo, hi)
            mid = (lo + hi) / 2
            up = (g / (1 + mid[:, None] * g)).sum(-1) > 0
            lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
        w = 2 * np.log1p((lo + hi)[:, None] / 2 * g).sum(-1)
    return np.where(inside, w, np.inf)


def el(x: np.ndarray, rng: np.random.Generator, b: int) -> np.ndarray:
    return stats.chi2.sf(el_statistic(x), 1)


@per_sample
def bootstrap_el(x: np.ndarray, rng: np.random.Generator, b: int) -> float:
    star = x[rng.integers(0, len(x), (b, len(x)))]
    w, w_star = el_statistic(x[None])[0], el_statistic(star - x.mean())
    return float(((w_star >= w).sum() + 1) / (b + 1))


def bartlett_el(x: np.ndarray, rng: np.random.Generator, b: int) -> np.ndarray:
    c = x - x.mean(-1, keepdims=True)
    m2, m3, m4 = ((c**k).mean(-1) for k in (2, 3, 4))
    a = m4 / (2 * m2**2) - m3**2 / (3 * m2**3)
    return stats.chi2.sf(el_statistic(x) / (1 + a / x.shape[-1]), 1)


def adjusted_el(x: np.ndarray, rng: np.random.Generator, b: int) -> np.ndarray:
    a_n = max(1.0, np.log(x.shape[-1]) / 2)
    return stats.chi2.sf(el_statistic(np.column_stack([x, -a_n * x.mean(-1)])), 1)


def balanced_el(f_calibration: bool, s: float = 1.9) -> Callable:
    def test(x: np.ndarray, rng: np.random.Generator, b: int) -> np.ndarray:
        m, shift = x.mean(-1), s * x.std(-1, ddof=1) * np.sign(x.mean(-1))
        w = el_statistic(np.column_stack([x, -shift, 2 * m + shift]))
        return stats.f.sf(w, 1, x.shape[-1] - 1) if f_calibration else stats.chi2.sf(w, 1)

    return test


def modified_t(chen: bool) -> Callable:
    def test(x: np.ndarray, rng: np.random.Generator, b: int) -> np.ndarray:
        n, (m, s) = x.shape[-1], _t(x)
        skew = ((x - m[:, None]) ** 3).mean(-1) / (s * np.sqrt(n)) ** 3
        t, k = m / s, skew / (6 * np.sqrt(n))
        t1 = t + k * (1 + 2 * t**2) + (4 * k**2 * (t + 2 * t**3) if chen else 0)
        return 2 * stats.t.sf(np.abs(t1), n - 1)

    return test


TESTS: dict[str, Callable] = {
    "bootstrap-t": bootstrap_t,
    "double bootstrap": double_bootstrap,
    "wild, Mammen": wild(mammen=True),
    "sign-flip": wild(mammen=False),
    "Student t": lambda x, rng, b: stats.ttest_1samp(x, 0, axis=-1).pvalue,
    "EL": el,
    "Bartlett EL": bartlett_el,
    "bootstrap-calibrated EL": bootstrap_el,
    "adjusted EL": adjusted_el,
    "balanced augmented EL": balanced_el(f_calibration=False),
    "balanced augmented EL, F": balanced_el(f_calibration=True),
    "tilted bootstrap": tilted_bootstrap,
    "stabilised bootstrap-t": stabilised_bootstrap_t,
    "Johnson t": modified_t(chen=False),
    "Chen t": modified_t(chen=True),
    "balanced augmented EL, s = 3": balanced_el(f_calibration=False, s=3.0),
}


def cell(test: str, x: np.ndarray, seed: int, resamples: int) -> str:
    """Rejected % at 0.05 of `test` on the rows of `x`, with its 95 % Wilson interval; the
    resampling is seeded by (seed, n, the test's place in TESTS), whichever tests run."""
    rng = np.random.default_rng([seed, x.shape[1], list(TESTS).index(test)])
    k = int((TESTS[test](x, rng, resamples) < 0.05).sum())
    low, high = stats.binomtest(k, len(x)).proportion_ci(method="wilson")
    return f"{100 * k / len(x):.1f} % [{100 * low:.1f}, {100 * high:.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repetitions", type=int, default=1000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 20, 50, 100])
    parser.add_argument("--resamples", type=int, default=499)
    parser.add_argument("--tests", nargs="+", default=list(TESTS), choices=list(TESTS))
    parser.add_argument("--no-power", action="store_true")
    args = parser.parse_args()
    reps, start = args.repetitions, time.process_time()
    print(f"level at 0.05, {reps} seeded null samples a cell, {args.resamples} resamples")
    print("\n| null | test | " + " | ".join(f"n = {n}" for n in args.sizes) + " |")
    print("|---|---|" + "---|" * len(args.sizes))
    for j, (name, draw) in enumerate(NULLS.items()):
        samples = {n: draw(np.random.default_rng([j, n]), (reps, n)) for n in args.sizes}
        for test in args.tests:
            row = [cell(test, samples[n], j, args.resamples) for n in args.sizes]
            print(f"| {name} | {test} | " + " | ".join(row) + " |", flush=True)
    if not args.no_power:
        print("\n| test | " + " | ".join(f"power, {a} at n = {n}" for a, n, _ in ALTERNATIVES) + " |")
        print("|---|" + "---|" * len(ALTERNATIVES))
        samples = [np.random.default_rng([9, n]).normal(mu, 1, (reps, n)) for _, n, mu in ALTERNATIVES]
        for test in args.tests:
            row = [cell(test, x, 9, args.resamples) for x in samples]
            print(f"| {test} | " + " | ".join(row) + " |", flush=True)
    print(f"\nCPU time {time.process_time() - start:.0f} s")


if __name__ == "__main__":
    main()
