"""training/statistics.py (#35): the bootstrap intervals and the paired permutation test equal
scipy's given the same resamples, cover a known population value in 93-97 % of 400 seeded
repetitions (a mean-type and a rank-type metric), hold their type-I error under the null and
find a planted 2-point R@1 difference at n = 5,000; Holm's adjustment by hand. Vectorised: the
simulations share one draw of resamples across repetitions, so the file runs in seconds."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from training.statistics import (
    paired_intervals,
    UnitScores,
    bootstrap,
    holm,
    interval,
    intervals,
)
from helpers.training_helpers import sign_flip_pvalue
from training.sign_flip import sign_flip_pvalues

REPETITIONS = 400


def _ratio(num, den, axis=-1):
    return num.sum(axis) / den.sum(axis)


@pytest.mark.parametrize("seed", [0, 7])
def test_intervals_equal_scipy_percentile_bootstrap(seed):
    rng = np.random.default_rng(seed)
    hits = rng.integers(0, 6, 300).astype(float)  # t2i R@K: captions found per image of 5
    deltas = rng.normal(0.05, 0.2, 300)
    ours = bootstrap(
        {
            "r": UnitScores("images", hits, np.full(300, 5.0)),
            "mean": UnitScores("pairs", deltas),
            "median": UnitScores("pairs", deltas, median=True),
        },
        1000,
        seed,
    )
    ref = {
        "r": stats.bootstrap(
            (hits, np.full(300, 5.0)),
            _ratio,
            paired=True,
            vectorized=True,
            method="percentile",
            n_resamples=1000,
            rng=np.random.default_rng(seed),
        ),
        "mean": stats.bootstrap(
            (deltas,), np.mean, vectorized=True, method="percentile", n_resamples=1000, rng=np.random.default_rng(seed)
        ),
        "median": stats.bootstrap(
            (deltas,),
            np.median,
            vectorized=True,
            method="percentile",
            n_resamples=1000,
            rng=np.random.default_rng(seed),
        ),
    }
    for name, res in ref.items():
        assert ours[name] == pytest.approx(res.bootstrap_distribution, abs=1e-12), name
        assert interval(ours[name]) == pytest.approx(tuple(res.confidence_interval), abs=1e-12), name


def test_grouped_metric_is_the_mean_of_group_ratios():
    rng = np.random.default_rng(1)
    hits, classes = (rng.random(200) < 0.4).astype(float), rng.integers(0, 7, 200)
    metric = UnitScores("images", hits, groups=classes)
    assert metric.value() == pytest.approx(np.mean([hits[classes == c].mean() for c in range(7)]))
    counts = np.bincount(rng.integers(0, 200, 200), minlength=200)[None].astype(float)
    drawn = np.repeat(np.arange(200), counts[0].astype(int))
    expected = np.mean([hits[drawn][classes[drawn] == c].mean() for c in np.unique(classes[drawn])])
    assert metric.on(counts)[0] == pytest.approx(expected)


@pytest.mark.parametrize("median", [False, True])
def test_pvalue_equals_scipy_permutation_test_given_its_swaps(median):
    rng = np.random.default_rng(3)
    a, b = rng.normal(0.1, 1, 250), rng.normal(0.25, 1, 250)
    seen = []

    def statistic(x, y, axis):
        seen.append(x)
        f = np.median if median else np.mean
        return f(x, axis=axis) - f(y, axis=axis)

    res = stats.permutation_test(
        (a, b), statistic, permutation_type="samples", vectorized=True, n_resamples=999, rng=np.random.default_rng(5)
    )
    swapped = next(x for x in seen if x.ndim == 2) != a  # where scipy put b's score in a's place
    ours = sign_flip_pvalue(
        UnitScores("pairs", a, median=median), UnitScores("pairs", b, median=median), 999, 0, swapped=swapped
    )
    assert ours == pytest.approx(res.pvalue, abs=1e-12)


def test_holm_adjustment():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1, then running maximum
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert np.isnan(holm([0.2, float("nan")])[1]) and holm([0.2, float("nan")])[0] == pytest.approx(0.2)


def _coverage(metrics: dict[int, UnitScores], truth: float) -> float:
    resampled = bootstrap(metrics, 1000, 11)
    covered = [low <= truth <= high for low, high in (interval(resampled[k]) for k in metrics)]
    return float(np.mean(covered))


def test_coverage_of_a_mean_type_metric():
    """ITM delta mean over 300 pairs, deltas N(0.04, 0.15^2): the 95 % interval covers 0.04."""
    rng = np.random.default_rng(2024)
    reps = {r: UnitScores("pairs", rng.normal(0.04, 0.15, 300)) for r in range(REPETITIONS)}
    assert 0.93 <= _coverage(reps, 0.04) <= 0.97


def test_coverage_of_a_rank_type_metric():
    """t2i R@1 over 400 images with 5 captions each, each caption found with probability 0.3."""
    rng = np.random.default_rng(2025)
    reps = {
        r: UnitScores("images", rng.binomial(5, 0.3, 400).astype(float), np.full(400, 5.0)) for r in range(REPETITIONS)
    }
    assert 0.93 <= _coverage(reps, 0.3) <= 0.97


def _paired_r1(rng, n: int, up: float, down: float) -> tuple[UnitScores, UnitScores]:
    """Two models' i2t R@1 hits on the same n images: the second agrees with the first but on a
    fraction `up` of images it finds and the first misses, and `down` the other way round."""
    first = (rng.random(n) < 0.5).astype(float)
    change = rng.random(n)
    second = first.copy()
    second[(first == 0) & (change < 2 * up)] = 1.0
    second[(first == 1) & (change < 2 * down)] = 0.0
    return UnitScores("images", first), UnitScores("images", second)


def test_type_one_error_of_the_paired_test():
    """Identical score distributions (discordant images equally likely either way)."""
    rng = np.random.default_rng(7)
    pairs = {r: _paired_r1(rng, 2000, 0.06, 0.06) for r in range(REPETITIONS)}
    p = np.array(list(sign_flip_pvalues(pairs, 1000, 3).values()))
    assert 0.03 <= float(np.mean(p < 0.05)) <= 0.07


def test_power_for_a_planted_two_point_r_at_1_difference():
    """n = 5,000, the second model 2 points better (7 % of images gained, 5 % lost)."""
    rng = np.random.default_rng(8)
    pairs = {r: _paired_r1(rng, 5000, 0.07, 0.05) for r in range(REPETITIONS)}
    diffs = [b.value() - a.value() for a, b in pairs.values()]
    assert np.mean(diffs) == pytest.approx(0.02, abs=0.002)
    p = np.array(list(sign_flip_pvalues(pairs, 1000, 3).values()))
    assert float(np.mean(p < 0.05)) >= 0.95


# --- #42: exact tests where cheap, intervals that cover at small n, clusters -------------------


@pytest.mark.parametrize(("n", "resamples"), [(8, 1000), (9, 512)])
@pytest.mark.parametrize("median", [False, True])
def test_pvalue_is_exact_and_equals_scipy_when_every_sign_pattern_fits(n, resamples, median):
    """2^n <= B: every swap pattern is enumerated, as scipy does: its p-value, for any seed."""
    rng = np.random.default_rng(n)
    a, b = rng.normal(0, 1, n), rng.normal(0.4, 1, n)
    f = np.median if median else np.mean
    res = stats.permutation_test(
        (a, b),
        lambda x, y, axis: f(x, axis=axis) - f(y, axis=axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=resamples,
        rng=np.random.default_rng(0),
    )
    ours = [
        sign_flip_pvalue(UnitScores("pairs", a, median=median), UnitScores("pairs", b, median=median), resamples, s)
        for s in (0, 1, 2)
    ]
    assert ours == pytest.approx([res.pvalue] * 3, abs=1e-12)


def test_pvalue_is_random_above_the_enumeration_limit():
    """2^10 > 1,000: random patterns, (tail + 1) / (B + 1) as scipy; seed-dependent, and within
    Monte-Carlo error of the exact p-value."""
    rng = np.random.default_rng(10)
    a, b = rng.normal(0, 1, 10), rng.normal(0.5, 1, 10)
    exact = stats.permutation_test(
        (a, b),
        lambda x, y, axis: x.mean(axis) - y.mean(axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=2**10,
        rng=np.random.default_rng(0),
    ).pvalue
    ours = [sign_flip_pvalue(UnitScores("pairs", a), UnitScores("pairs", b), 1000, s) for s in range(4)]
    assert len(set(ours)) > 1
    tail = exact / 2  # the two-sided p-value is twice a tail estimated from 1,000 patterns
    assert all(abs(p - exact) < 8 * np.sqrt(tail * (1 - tail) / 1000) + 2 / 1001 for p in ours)


def test_swaps_of_a_cluster_go_together():
    """Clusters of 2 units: the exact test over 2^3 cluster patterns equals scipy's on the
    cluster sums (a mean of units is the mean of their clusters' sums over 2)."""
    a, b = np.array([0.1, 0.3, 0.2, 0.9, 0.5, 0.4]), np.array([0.0, 0.1, 0.4, 0.3, 0.1, 0.2])
    clusters = np.array([7, 7, 3, 3, 5, 5])
    ours = sign_flip_pvalue(
        UnitScores("pairs", a, clusters=clusters), UnitScores("pairs", b, clusters=clusters), 1000, 0
    )
    sums = [np.bincount(np.unique(clusters, return_inverse=True)[1], x) for x in (a, b)]
    ref = stats.permutation_test(
        sums,
        lambda x, y, axis: x.mean(axis) - y.mean(axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=1000,
    ).pvalue
    assert ours == pytest.approx(ref, abs=1e-12)


def test_proportion_interval_is_clopper_pearson():
    """R@1 0 of 6 images: [0, 0.459] (the exact binomial bound), never [0, 0]; 31 of 50."""
    zero = intervals({"r": UnitScores("images", np.zeros(6), proportion=True)}, 1000, 0)["r"]
    assert (zero.low, zero.high, zero.method, zero.trivial) == (
        0.0,
        pytest.approx(1 - 0.025 ** (1 / 6)),
        "clopper-pearson",
        False,
    )
    hits = np.r_[np.ones(31), np.zeros(19)]
    found = intervals({"r": UnitScores("images", hits, proportion=True)}, 0, 0)["r"]
    ref = stats.binomtest(31, 50).proportion_ci(method="exact")
    assert (found.low, found.high) == pytest.approx((ref.low, ref.high), abs=1e-10)


def test_proportion_of_clustered_trials_counts_the_design_effect():
    """t2i R@K, 5 captions an image that are all hits or all misses: the 500 captions are about
    100 independent trials (design effect 5 x 100/99 with the cluster variance's c/(c-1)), so the
    interval is Korn & Graubard's Clopper-Pearson on 99 effective trials, not on 500, times their
    degrees-of-freedom factor (t_499 / t_99)^2 (Korn & Graubard 1998, their n*_df)."""
    hits = np.r_[np.full(40, 5.0), np.zeros(60)]
    found = intervals({"r": UnitScores("images", hits, np.full(100, 5.0), proportion=True)}, 0, 0)["r"]
    n_eff = 99.0 * (stats.t.ppf(0.975, 499) / stats.t.ppf(0.975, 99)) ** 2
    x = 0.4 * n_eff
    ref = (stats.beta.ppf(0.025, x, n_eff - x + 1), stats.beta.ppf(0.975, x + 1, n_eff - x))
    assert (found.low, found.high) == pytest.approx(ref, abs=1e-9)
    naive = stats.binomtest(200, 500).proportion_ci(method="exact")
    assert found.high - found.low > 2 * (naive.high - naive.low)


def test_paired_proportions_get_newcombes_hybrid_interval_inside_minus_one_to_one():
    """Two models' R@1 on the same 12 images: Newcombe's (1998) method 10 as the MOVER of Zou &
    Donner (2008), from each proportion's exact interval (scipy's) and the phi coefficient of
    the 2 x 2 table, by hand; far apart at few units it stays within [-1, 1] (#50: the
    bootstrap-t gave R@1's difference -0.1333 [-1.4667, 0.1559])."""
    a = np.r_[np.ones(7), np.zeros(5)]
    b = np.r_[np.ones(3), np.zeros(6), np.ones(3)]
    found = paired_intervals(
        {"r": (UnitScores("images", a, proportion=True), UnitScores("images", b, proportion=True))}, 200, 0
    )["r"]
    both, only_a, only_b, neither = (a * b).sum(), (a * (1 - b)).sum(), ((1 - a) * b).sum(), ((1 - a) * (1 - b)).sum()
    phi = (both * neither - only_a * only_b) / np.sqrt(
        (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    )
    (la, ua), (lb, ub) = (stats.binomtest(int(x.sum()), 12).proportion_ci(method="exact") for x in (a, b))
    pa, pb = a.mean(), b.mean()
    low = pa - pb - np.sqrt((pa - la) ** 2 + (ub - pb) ** 2 - 2 * phi * (pa - la) * (ub - pb))
    high = pa - pb + np.sqrt((ua - pa) ** 2 + (pb - lb) ** 2 - 2 * phi * (ua - pa) * (pb - lb))
    assert found.method == "newcombe" and (found.low, found.high) == pytest.approx((low, high), abs=1e-9)
    ones, one = UnitScores("images", np.ones(6), proportion=True), UnitScores("images", np.eye(6)[0], proportion=True)
    extreme = paired_intervals({"r": (ones, one)}, 200, 0)["r"]
    assert -1 <= extreme.low < 5 / 6 < extreme.high <= 1


def test_studentized_interval_of_a_mean_by_hand():
    """Bootstrap-t of a mean, the same draws as scipy's bootstrap: t* = (mean* - mean) / se*."""
    rng = np.random.default_rng(4)
    x = rng.exponential(1, 30)
    found = intervals({"m": UnitScores("pairs", x)}, 2000, 9)["m"]
    draws = x[np.random.default_rng(9).integers(0, 30, (2000, 30))]
    t = (draws.mean(1) - x.mean()) / (draws.std(1, ddof=1) / np.sqrt(30))
    se = x.std(ddof=1) / np.sqrt(30)
    low, high = np.quantile(t, [0.025, 0.975])
    assert found.method == "studentized"
    assert (found.low, found.high) == pytest.approx((x.mean() - high * se, x.mean() - low * se), rel=1e-9)


def test_trivial_metric_says_so_and_tiny_class_has_no_interval():
    """No interval, each saying why: R@10 over 6 images is fixed by construction (`trivial`);
    6 equal deltas are a sample without spread, not a metric the units cannot move (#42); one
    class query is one cluster."""
    found = intervals(
        {
            "r10": UnitScores("images", np.ones(6), proportion=True, trivial=True),
            "same": UnitScores("pairs", np.full(6, 0.25)),
            "class": UnitScores("queries", np.r_[0.4, np.zeros(5)], np.r_[1.0, np.zeros(5)]),
        },
        1000,
        0,
    )
    assert found["r10"].trivial and np.isnan(found["r10"].low) and found["r10"].note == "fixed by construction"
    same = found["same"]
    assert (same.method, same.trivial, same.note) == ("none", False, "all 6 units equal") and np.isnan(same.low)
    assert (found["class"].n, found["class"].n_clusters, found["class"].trivial) == (1, 1, False)
    assert np.isnan(found["class"].low) and found["class"].note == "one cluster"


def test_cluster_bootstrap_resamples_whole_clusters():
    """Units of one cluster are drawn together: the resampled mean equals the mean over a
    bootstrap of the clusters (scipy's draws of 3 clusters), and n_clusters is counted."""
    x = np.array([1.0, 2.0, 3.0, 10.0, 20.0])
    clusters = np.array([4, 4, 9, 1, 1])
    metric = UnitScores("pairs", x, clusters=clusters)
    ours = bootstrap({"m": metric}, 500, 3)["m"]
    sums, sizes = np.bincount([1, 1, 2, 0, 0], x), np.bincount([1, 1, 2, 0, 0])
    draws = np.random.default_rng(3).integers(0, 3, (500, 3))
    assert ours == pytest.approx(sums[draws].sum(1) / sizes[draws].sum(1))
    assert metric.counted() == (5, 3)


def test_paired_difference_of_means_is_studentized_on_the_unit_differences():
    """compare_dataset: a mean's difference gets the bootstrap-t interval of the per-unit
    differences (by hand, scipy's draws); a median's, the percentile one of the paired resamples."""
    from training.report.compare import compare_dataset

    rng = np.random.default_rng(8)
    shared = rng.normal(0, 1, 40)
    a, b = rng.exponential(1, 40) + shared, 0.5 * rng.exponential(1, 40) + shared
    units = {
        m: {"itm/IR_c_mean": UnitScores("pairs", x), "itm/IR_c_median": UnitScores("pairs", x, median=True)}
        for m, x in (("A", a), ("B", b))
    }
    found = {c.metric: c for c in compare_dataset("cf", units, ["A", "B"], 2000, 4)}
    d = a - b
    draws = np.random.default_rng(4).integers(0, 40, (2000, 40))
    t = (d[draws].mean(1) - d.mean()) / (d[draws].std(1, ddof=1) / np.sqrt(40))
    se = d.std(ddof=1) / np.sqrt(40)
    t_low, t_high = np.quantile(t, [0.025, 0.975])
    mean = found["IR_c_mean"]
    assert (mean.low, mean.high) == pytest.approx((d.mean() - t_high * se, d.mean() - t_low * se), rel=1e-9)
    median = found["IR_c_median"]
    diffs = np.median(a[draws], 1) - np.median(b[draws], 1)
    assert (median.low, median.high) == pytest.approx(tuple(np.quantile(diffs, [0.025, 0.975])), rel=1e-9)


def test_cluster_pages_are_bounded_by_units_and_change_no_number(monkeypatch):
    """A page of clusters becomes a page of units: its rows are bounded by the units, and the
    resamples and p-values do not depend on the page size."""
    import training.statistics as statistics

    rng = np.random.default_rng(12)
    clusters = np.repeat(np.arange(30), 4)
    a = UnitScores("pairs", rng.normal(0, 1, 120), clusters=clusters)
    b = UnitScores("pairs", rng.normal(0.2, 1, 120), clusters=clusters)
    whole = (bootstrap({"a": a}, 300, 1)["a"], sign_flip_pvalue(a, b, 300, 1))
    monkeypatch.setattr(statistics, "PAGE_CELLS", 1000)
    assert max(len(c) for _, c in statistics.cluster_pages(a, 300, 1)) == 1000 // 120
    assert bootstrap({"a": a}, 300, 1)["a"] == pytest.approx(whole[0], abs=0)
    assert sign_flip_pvalue(a, b, 300, 1) == whole[1]


@pytest.mark.parametrize("n", [10, 50])
def test_the_detectable_difference_is_found_with_80_percent_power(n):
    """The bootstrap-t test's detectable difference (compare.mean_tests, from its own t*), checked
    by simulation: 2,000 seeded samples of n normal paired differences, shifted by the mean printed
    detectable difference; the test rejects at 0.05 in 80 % of them (Wilson half-width about 2
    points). The noncentral t on the se's Satterthwaite df, used before, gave 73 % at n = 10."""
    from training.report.compare import mean_tests

    samples = np.random.default_rng(n).normal(0, 1, (2000, n))
    null = mean_tests({k: UnitScores("pairs", x) for k, x in enumerate(samples)}, 1000, 0)
    shift = np.mean([least for _, _, least, _ in null.values()])
    found = mean_tests({k: UnitScores("pairs", x + shift) for k, x in enumerate(samples)}, 1000, 1)
    power = np.mean([p < 0.05 for p, *_ in found.values()])
    assert 0.77 <= power <= 0.83, power


def test_the_sign_flip_tests_detectable_difference_is_found_with_80_percent_power():
    """The same for the sign-flip test (a median's or a mean over groups' in the report), with
    its critical value from Student's t (Efron 1969) and the bootstrap standard error."""
    from training.report.compare import _sign_flip

    n, samples = 50, np.random.default_rng(3).normal(0, 1, (2000, 50))
    spreads = bootstrap({k: UnitScores("pairs", x) for k, x in enumerate(samples)}, 1000, 0)
    shift = np.mean([_sign_flip(0.5, spreads[k], n)[2] for k in spreads])  # (p, se, detectable, name)
    zero = UnitScores("pairs", np.zeros(n))
    pairs = {k: (UnitScores("pairs", x + shift), zero) for k, x in enumerate(samples)}
    power = np.mean(np.array(list(sign_flip_pvalues(pairs, 1000, 1).values())) < 0.05)
    assert 0.76 <= power <= 0.84, power


def test_no_detectable_difference_where_no_test_is_made():
    """No standard error or no degrees of freedom (no test: below 6 clusters compare_dataset
    makes none, test_report_few_clusters.py): no difference is detectable (NaN). A numpy df does
    not overflow."""
    from training.report.compare import detectable

    assert np.isnan(detectable(1.0, float("nan"), 2.0)) and np.isfinite(detectable(1.0, 5, 2.0))
    assert np.isnan(detectable(0.0, 50, 2.0)) and np.isnan(detectable(float("nan"), 50, 2.0))
    assert detectable(1.0, np.int64(200), 2.0) == pytest.approx(detectable(1.0, 200, 2.0))
