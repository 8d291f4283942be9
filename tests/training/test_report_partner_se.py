"""The real pairs' partner dependence (#42): unit i of IR_r/TR_r also uses unit r(i)'s image or
caption, so the studentized interval of their mean takes the two-way (dyadic) cluster-robust
standard error (Cameron, Gelbach & Miller 2011) of units that share an input: checked against
the formula computed densely by hand, against the variance of the mean over many simulated
samples, and by coverage where the resampled-as-independent interval under-covered."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from training.statistics import UnitScores, dyadic_df, dyadic_t, intervals, paired_difference, robust_se
from training.unit_scores import delta_units, real_partners


def _shared(partners: np.ndarray) -> np.ndarray:
    """(n, n) 1 where units i and j share an input: j = i, j = r(i) or i = r(j)."""
    n = len(partners)
    a = np.eye(n)
    a[np.arange(n), partners] = a[partners, np.arange(n)] = 1
    return a


@pytest.mark.parametrize("num", [[1.0, 0.0], [0.5, 0.5], [0.2, 0.7]])
def test_two_units_each_the_others_partner_get_the_floor_df_and_an_interval_in_range(num):
    """Two real pairs, each the other's partner, leave the working model no residual (0/0): the
    df is its floor, 1, and the interval is finite and inside the metric's range (it was NaN)."""
    metric = UnitScores("pairs", np.array(num), partners=np.array([1, 0]), bounds=(-1.0, 1.0))
    low, high = dyadic_t(metric)
    assert dyadic_df(metric) == 1.0
    assert -1.0 <= low <= np.mean(num) <= high <= 1.0


def test_robust_se_is_the_dyadic_variance_by_hand():
    """A ratio metric (num over den) on 12 units whose partners include a 2-cycle (0 <-> 1, one
    link, not two): e' A e / (sum den)^2, A the shared-input matrix, times n^2 / (n^2 - sum A)."""
    rng = np.random.default_rng(4)
    partners = np.r_[1, 0, np.roll(np.arange(2, 12), 1)]
    num, den = rng.normal(1, 1, 12), rng.integers(1, 4, 12).astype(float)
    metric = UnitScores("real pairs", num, den, partners=partners)
    e = num - num.sum() / den.sum() * den
    a = _shared(partners)
    variance = e @ a @ e / den.sum() ** 2 * 144 / (144 - a.sum())
    assert a.sum() == 12 + 2 * 11  # 11 links: the 2-cycle is one
    assert robust_se(metric) == pytest.approx(np.sqrt(variance), rel=1e-12)
    # Without partners: the iid (linearised) standard error.
    iid = np.sqrt((e * e).sum() * 12 / 11) / den.sum()
    assert robust_se(UnitScores("real pairs", num, den)) == pytest.approx(iid, rel=1e-12)


def _distinctive(rng, n: int, partners: np.ndarray) -> np.ndarray:
    """IR_r deltas where an image's score with its own caption moves against its scores with
    other captions (benchmarks/report_coverage.py's adverse case): units i and r(i) move together."""
    d = rng.normal(0, 0.05, n)
    image = np.arange(n)

    def score(c, i):  # G(caption c, image i)
        return np.where(c == i, 0.1 + d[i], -d[i]) + rng.normal(0, 0.02, n)

    return score(partners, partners) - score(partners, image)


def test_robust_variance_is_the_variance_of_the_mean_over_samples():
    """4,000 samples of 40 real pairs on one derangement: the mean robust variance is the
    variance of the sample mean across samples (within 10 %); the iid one is far below it."""
    n, partners = 40, real_partners(40)
    rng = np.random.default_rng(0)
    means, robust, iid = [], [], []
    for _ in range(4000):
        values = _distinctive(rng, n, partners)
        means.append(values.mean())
        robust.append(robust_se(UnitScores("real pairs", values, partners=partners)) ** 2)
        iid.append(values.var(ddof=1) / n)
    truth = np.var(means)
    assert np.mean(robust) == pytest.approx(truth, rel=0.1)
    assert np.mean(iid) < 0.75 * truth


def test_real_pair_intervals_cover_the_population_mean():
    """300 seeded samples of 50 real pairs (the adverse case), through `delta_units` as the
    evaluation builds them: the IR_r mean's interval holds the population value 0.1 in at least
    90 % (it covered 84.5 % with the pairs resampled as independent units)."""
    n = 50
    rng = np.random.default_rng(n)
    covered = 0
    for rep in range(300):
        scores = {"g_cr_ir": np.zeros(n), "g_cr_io": -_distinctive(rng, n, real_partners(n))}
        found = intervals({"m": delta_units(scores)["itm/IR_r_mean"]}, 1000, rep)["m"]
        covered += found.low <= 0.1 <= found.high
    assert covered >= 0.9 * 300, covered


def _image_effect(rng, n: int, partners: np.ndarray) -> dict:
    """IR_r's scores where an image's scores move together (benchmarks/report_coverage.py's
    derangement-partner case): G(c, i) = u_i + v_c + 0.02 a_c a_i + m_c [c = i] + noise, the
    image effect u cancelling in the mean; the population mean is 0.1 + 0.02 = 0.12."""
    u, v, a = rng.normal(0, 0.05, n), rng.normal(0, 0.03, n), rng.normal(0, 1, n)
    match = 0.05 + rng.exponential(0.05, n)

    def score(c, i):  # G(caption c, image i)
        return u[i] + v[c] + 0.02 * a[c] * a[i] + np.where(c == i, match[c], 0) + rng.normal(0, 0.02, n)

    return {"g_cr_ir": score(partners, partners), "g_cr_io": score(partners, np.arange(n))}


def test_real_pair_intervals_cover_where_an_image_effect_cancels():
    """300 seeded samples of 50 real pairs whose linked residuals correlate negatively: the
    dyadic se is unbiased but noisier than the bootstrap's t* allow for, so the interval refers
    it to t on its Satterthwaite degrees of freedom (`dyadic_t`, Bell & McCaffrey 2002) and
    covers 0.12 in at least 95 % (the dyadic se with the bootstrap's t*: 90.7 %, 272 of 300)."""
    n, partners = 50, real_partners(50)
    rng = np.random.default_rng(7)
    covered = 0
    for rep in range(300):
        metric = delta_units(_image_effect(rng, n, partners))["itm/IR_r_mean"]
        found = intervals({"m": metric}, 1000, rep)["m"]
        covered += found.low <= 0.12 <= found.high
    assert covered >= 0.95 * 300, covered


def test_the_real_pairs_partners_are_the_evaluations_derangement():
    """evaluation.itm_inputs scores image i against caption r(i) (IR_r's g_cr_io), r the
    partners delta_units carries; a paired difference of two models keeps them, and a subset
    of the units (per_class.restrict) renumbers them."""
    from training.evaluation import itm_inputs
    from training.report.per_class import restrict

    rng = np.random.default_rng(1)
    images, texts = rng.normal(size=(7, 4)), rng.normal(size=(7, 4))
    data = SimpleNamespace(image_ids=np.arange(7), caption_image=np.arange(7))
    scores = itm_inputs({"image": images, "text": texts}, data)
    units = delta_units(scores)
    partners = units["itm/IR_r_mean"].partners
    assert np.array_equal(units["itm/TR_r_mean"].partners, partners)
    assert scores["g_cr_io"] == pytest.approx((texts[partners] * images).sum(1))
    other = delta_units({k: v + rng.normal(0, 0.01, 7) for k, v in scores.items()})
    difference = paired_difference(units["itm/IR_r_mean"], other["itm/IR_r_mean"])
    assert np.array_equal(difference.partners, partners)
    keep = np.arange(7) != partners[0]  # unit 0 loses its partner
    subset = restrict(units["itm/IR_r_mean"], keep, "some real pairs")
    kept = np.flatnonzero(keep)
    for new, old in enumerate(kept):
        expected = np.flatnonzero(kept == partners[old])
        assert subset.partners[new] == (expected[0] if len(expected) else -1)


def test_the_test_of_real_pair_means_is_the_dual_of_the_dyadic_t_interval():
    """30 real pairs of two models (the adverse case: the dyadic se above the iid one): the
    p-value is the dyadic-t test's by hand, 2 P(T_df > |mean| / dyadic se), df the smaller of
    2 V^2 / (c var(s)) with s_k = e_k (e_k + the residuals linked to k) and (tr Q)^2 / tr(Q^2),
    Q = M (I + A) M, M = I - J / n (Bell & McCaffrey 2002, dense matrices here), the test
    whose acceptance region is the interval's; without partners the bootstrap-t test, t = mean /
    iid se against t* = (mean* - mean) / max(se*, 0.1 se) of the report's resamples,
    2 min(#{t* <= t} + 1, #{t* >= t} + 1) / (B + 1)."""
    from training.report.compare import mean_tests

    n, resamples = 30, 999
    rng = np.random.default_rng(2)
    partners = real_partners(n)
    d = _distinctive(rng, n, partners) - _distinctive(rng, n, partners) + 0.01
    linked = UnitScores("real pairs", d, partners=partners)
    e = d - d.mean()
    shares = e * (_shared(partners) @ e)
    q = (np.eye(n) - 1 / n) @ _shared(partners) @ (np.eye(n) - 1 / n)
    df = min(2 * shares.sum() ** 2 / (n * shares.var(ddof=1)), np.trace(q) ** 2 / np.sum(q * q))
    se = robust_se(linked)
    ((p, found_se, _, name),) = mean_tests({0: linked}, resamples, 4).values()
    expected = 2 * stats.t.sf(abs(d.mean()) / se, df)
    assert (p, found_se, name) == (pytest.approx(expected, rel=1e-9), pytest.approx(se), "dyadic-t")
    critical = stats.t.ppf(0.975, df)
    assert dyadic_t(linked) == pytest.approx((d.mean() - critical * se, d.mean() + critical * se))
    x = d[np.random.default_rng(4).integers(0, n, (resamples, n))]
    iid = d.std(ddof=1) / np.sqrt(n)
    t = (x.mean(1) - d.mean()) / np.maximum(x.std(1, ddof=1) / np.sqrt(n), 0.1 * iid)
    observed = d.mean() / iid
    expected = min(1, 2 * (min(np.sum(t <= observed), np.sum(t >= observed)) + 1) / (resamples + 1))
    ((p, found_se, _, name),) = mean_tests({0: UnitScores("real pairs", d)}, resamples, 4).values()
    assert (p, found_se, name) == (pytest.approx(expected, abs=1e-12), pytest.approx(iid), "bootstrap-t")
    assert se > 1.2 * iid


@pytest.mark.parametrize("case", ["adverse", "image effect"])
def test_the_real_pairs_mean_test_holds_its_level(case):
    """400 null samples of 50 real pairs (two models, scored through `delta_units`), tested as
    the report tests a difference in means (compare.mean_tests): rejections at 0.05 stay near
    5 % (in the adverse case 15.5 % with the plain sign-flip sum, whose swaps take the linked
    pairs as independent; with an image effect the studentized sign-flip test rejected 7.8 %)."""
    from training.report.compare import mean_tests

    n, partners = 50, real_partners(50)
    rng = np.random.default_rng(1)

    def model():
        if case == "adverse":
            return delta_units({"g_cr_ir": np.zeros(n), "g_cr_io": -_distinctive(rng, n, partners)})["itm/IR_r_mean"]
        return delta_units(_image_effect(rng, n, partners))["itm/IR_r_mean"]

    differences = {rep: paired_difference(model(), model()) for rep in range(400)}
    rejected = sum(p < 0.05 for p, *_ in mean_tests(differences, 1000, 0).values())
    assert rejected <= 0.08 * 400, rejected


def test_the_adverse_real_pairs_test_holds_its_level_at_8_pairs():
    """400 null samples of 8 real pairs in the adverse case (linked units move together): the
    dyadic-t test on the smaller of the empirical and the working-model Satterthwaite df
    (statistics.dyadic_df) rejects at most 6 % at 0.05; on the empirical df alone 9 %."""
    from training.report.compare import mean_tests

    n, partners, rng = 8, real_partners(8), np.random.default_rng(8)

    def model():
        return delta_units({"g_cr_ir": np.zeros(n), "g_cr_io": -_distinctive(rng, n, partners)})["itm/IR_r_mean"]

    differences = {rep: paired_difference(model(), model()) for rep in range(400)}
    rejected = sum(p < 0.05 for p, *_ in mean_tests(differences, 1000, 0).values())
    assert rejected <= 0.06 * 400, rejected


def test_two_equal_models_on_real_pairs_differ_with_p_one():
    from helpers.training_helpers import sign_flip_pvalue

    values = np.random.default_rng(3).normal(0, 1, 12)
    a = UnitScores("real pairs", values, partners=real_partners(12))
    assert sign_flip_pvalue(a, a, 1000, 0) == 1.0


def test_a_real_pair_proportion_counts_its_partners_in_the_design_effect():
    """IR_r's fraction below zero: Clopper-Pearson on n / deff trials, deff the dyadic variance
    (by hand, the shared-input matrix) over the binomial one (at least 1); linked pairs that
    move together give fewer effective trials than the plain binomial of the 40 pairs."""
    partners = real_partners(40)
    below = np.zeros(40)
    below[:6] = 1
    below[partners[:6]] = 1  # each below-zero pair's partner too
    n, p = 40, below.mean()
    e, a = below - p, _shared(partners)
    deff = max(1.0, (e @ a @ e / n**2 * n * n / (n * n - a.sum())) / (p * (1 - p) / n))
    n_eff = n / deff
    x = p * n_eff
    expected = (stats.beta.ppf(0.025, x, n_eff - x + 1), stats.beta.ppf(0.975, x + 1, n_eff - x))
    found = intervals({"f": UnitScores("real pairs", below, proportion=True, partners=partners)}, 0, 0)["f"]
    assert deff > 1.2 and found.method == "clopper-pearson"
    assert (found.low, found.high) == pytest.approx(expected, rel=1e-9)
    plain = stats.binomtest(int(below.sum()), n).proportion_ci(method="exact")
    assert found.high - found.low > plain.high - plain.low
