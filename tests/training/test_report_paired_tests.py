"""The report's paired tests (#50): an exact p-value is the exact one, never 0; degenerate and
too-small comparisons are not tested and stay out of the Holm family; the test of a difference
in means holds its level where the per-unit differences are skewed or linked. References are
independent: exact rational enumeration of every sign pattern (fractions.Fraction), by hand."""

from __future__ import annotations

import itertools
from fractions import Fraction
from statistics import median

import numpy as np
import pytest

from training.report.compare import compare_dataset
from helpers.training_helpers import sign_flip_pvalue
from training.statistics import UnitScores


def _exact_pvalue(a: np.ndarray, b: np.ndarray, statistic) -> Fraction:
    """The two-sided sign-flip p-value, min(1, 2 min(#{T <= t}, #{T >= t}) / 2^n), on exact
    rationals: the floats' own values, every swap pattern, no tolerance."""
    a, b = [Fraction(x) for x in a], [Fraction(x) for x in b]
    null = []
    for swap in itertools.product([False, True], repeat=len(a)):
        x = [bi if s else ai for ai, bi, s in zip(a, b, swap, strict=True)]
        y = [ai if s else bi for ai, bi, s in zip(a, b, swap, strict=True)]
        null.append(statistic(x) - statistic(y))
    observed = statistic(a) - statistic(b)
    tails = sum(t <= observed for t in null), sum(t >= observed for t in null)
    return min(Fraction(1), Fraction(2 * min(tails), len(null)))


def _better_everywhere(seed: int, n: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """Values near 0.5, the first model ahead on every unit by about 1e-3 (the audit's case)."""
    rng = np.random.default_rng(seed)
    b = rng.uniform(0.45, 0.55, n)
    return b + 1e-3 * rng.uniform(0.9, 1.1, n), b


@pytest.mark.parametrize("is_median", [False, True])
def test_the_exact_pvalue_is_the_rational_enumeration_and_never_0(is_median):
    """n = 6, one model better on every unit by ~1e-3 with values ~0.5: for the mean the no-swap
    pattern is the most extreme of 64, p = 2 / 64 exactly (on main, 36-49 % of such samples gave
    0); the median's p-value is its own enumeration's."""
    statistic = median if is_median else (lambda x: sum(x) / len(x))
    for seed in range(60):
        a, b = _better_everywhere(seed)
        expected = _exact_pvalue(a, b, statistic)
        assert is_median or expected == Fraction(1, 32)
        found = sign_flip_pvalue(
            UnitScores("pairs", a, median=is_median), UnitScores("pairs", b, median=is_median), 1000, 0
        )
        assert Fraction(found) == expected, (seed, found)


def test_an_exact_pvalue_with_ties_and_clusters_is_the_rational_one():
    """Clusters of two units and tied differences (clusters with no difference, equal sums;
    dyadic scores, so the ties are exact in floating point too): the p-value equals the rational
    enumeration over the cluster sums."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        b = rng.integers(400, 600, 14) / 1024
        a = b + rng.choice([0, 1, -1, 2], 14) / 1024
        clusters = np.repeat(np.arange(7), 2)
        sums = [np.bincount(clusters, x) for x in (a, b)]
        expected = _exact_pvalue(*sums, lambda x: sum(x) / len(x))
        found = sign_flip_pvalue(
            UnitScores("pairs", a, clusters=clusters),
            UnitScores("pairs", b, clusters=clusters),
            1000,
            0,
        )
        assert Fraction(found) == expected


def _compared(units: dict, resamples: int = 1000, seed: int = 0):
    """compare_dataset of models A and B on `units` (key -> (A's, B's) UnitScores)."""
    by_model = {m: {key: pair[i] for key, pair in units.items()} for i, m in enumerate("AB")}
    return {f"{c.task}/{c.metric}": c for c in compare_dataset("d", by_model, ["A", "B"], resamples, seed)}


def test_the_report_path_never_gives_p_0():
    """Through compare_dataset, the audit's case (600 tests, 240 of them p = 0 on main, Holm 0
    and a bold cell): every p-value and Holm-adjusted one is positive, the median's the rational
    enumeration's."""
    for seed in range(40):
        a, b = _better_everywhere(seed)
        tests = _compared(
            {
                "itm/IR_c_mean": (UnitScores("pairs", a), UnitScores("pairs", b)),
                "itm/IR_c_median": (UnitScores("pairs", a, median=True), UnitScores("pairs", b, median=True)),
            }
        )
        assert all(c.p_value > 0 and c.p_holm >= c.p_value for c in tests.values()), seed
        assert Fraction(tests["itm/IR_c_median"].p_value) == _exact_pvalue(a, b, median)


def _table(tests: dict, values: dict) -> str:
    """report.md's comparison table of models A and B (values: metric -> (A's, B's)), with the
    units and clusters of the comparisons as the records carry them."""
    from training.report.compare import verdicts
    from training.report.markdown import comparison_table

    sizes = {c.metric: (c.n, c.n_clusters) for c in tests.values()}
    records = [
        {
            "dataset": "d",
            "task": "itm",
            "model": m,
            "metrics": {k: float(v[i]) for k, v in values.items()},
            "n_units": {k: n for k, (n, _) in sizes.items()},
            "n_clusters": {k: c for k, (_, c) in sizes.items()},
        }
        for i, m in enumerate("AB")
    ]
    return "\n".join(comparison_table(records, "d", ["A", "B"], verdicts(records, "d", list(tests.values()))))


def test_a_fixed_metric_is_neither_tested_nor_in_the_holm_family():
    """A metric fixed by construction (R@K with K at least the gallery) beside a tested one: no
    p-value, its note, and the other's Holm p-value is its own (a family of one). On main it was
    tested (p = 1) and doubled the other's Holm p-value."""
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.3, 1, 40), rng.normal(0, 1, 40)
    ones = np.ones(40)
    tests = _compared(
        {
            "itm/IR_c_mean": (UnitScores("pairs", a), UnitScores("pairs", b)),
            "itm/R@10": (UnitScores("pairs", ones, trivial=True), UnitScores("pairs", ones, trivial=True)),
        }
    )
    fixed, tested = tests["itm/R@10"], tests["itm/IR_c_mean"]
    assert np.isnan(fixed.p_value) and np.isnan(fixed.p_holm) and fixed.note == "fixed by construction"
    assert np.isnan(fixed.low) and np.isnan(fixed.detectable) and not fixed.test
    assert 0 < tested.p_value < 1 and tested.p_holm == tested.p_value
    text = _table(tests, {"IR_c_mean": (a.mean(), b.mean()), "R@10": (1.0, 1.0)})
    assert "not tested: fixed by construction" in text


def test_below_the_floor_a_column_is_not_testable():
    """5 clusters (no p-value below 2 / 2^5 = 0.0625): no test, and the column says `not
    testable (n = ...)`, not `no significant difference` (on main: a p-value and no significant
    difference)."""
    rng = np.random.default_rng(1)
    clusters = np.repeat(np.arange(5), 2)
    a, b = rng.normal(1, 0.1, 10), rng.normal(0, 0.1, 10)
    tests = _compared(
        {"itm/IR_c_mean": (UnitScores("pairs", a, clusters=clusters), UnitScores("pairs", b, clusters=clusters))}
    )
    (c,) = tests.values()
    assert np.isnan(c.p_value) and np.isnan(c.p_holm) and c.n_clusters == 5
    text = _table(tests, {"IR_c_mean": (a.mean(), b.mean())})
    assert "not testable (n = 10 in 5 clusters, small sample)" in text and "no significant" not in text


def test_the_same_difference_on_every_unit_is_not_tested_and_says_so():
    """Every unit's difference equal (two identical models, or one ahead by the same amount
    everywhere): no interval, no test, and the note the single-model path gives, `all n units
    equal`; the column says it once."""
    x = np.random.default_rng(2).normal(0, 1, 30)
    for b in (x.copy(), x - 0.5):
        tests = _compared({"itm/IR_c_mean": (UnitScores("pairs", x), UnitScores("pairs", b))})
        (c,) = tests.values()
        assert np.isnan(c.p_value) and np.isnan(c.low) and np.isnan(c.detectable)
        assert c.note == "all 30 units equal"
        assert _table(tests, {"IR_c_mean": (x.mean(), b.mean())}).count("not tested: all 30 units equal") == 1


@pytest.mark.parametrize(("kind", "n", "most"), [("exponential", 12, 0.065), ("lognormal", 50, 0.075)])
def test_the_test_of_means_holds_its_level_on_skewed_differences(kind, n, most):
    """1,000 null samples of n paired differences with mean 0 and a long right tail (Exp(1) - 1;
    lognormal(0, 1) - e^0.5, skewness 6.2), through compare_dataset (one call, a column each):
    the bootstrap-t test of the means rejects at 0.05 in about 5 % (4.8 %, 5.9 % in numpy); the
    sign-flip test, which tests symmetry, rejected 8.9 % and 10.0 %."""
    rng = np.random.default_rng(n)
    draw = {
        "exponential": lambda: rng.exponential(1, n) - 1,
        "lognormal": lambda: rng.lognormal(0, 1, n) - np.exp(0.5),
    }
    zero = UnitScores("pairs", np.zeros(n))
    tests = _compared({f"itm/IR_c_mean_{r}": (UnitScores("pairs", draw[kind]()), zero) for r in range(1000)})
    rejected = np.mean([c.p_value < 0.05 for c in tests.values()])
    assert rejected <= most, rejected


def test_generator_bias_is_one_holm_family():
    """The generator-bias table (training/report/generator_bias.py) on 8 common pairs: every
    model's tests are compare_dataset's, and Holm adjusts them across the whole table (every
    model, metric and two generators) by hand."""
    from training.report.generator_bias import PAIR_UNITS, generator_bias

    rng = np.random.default_rng(4)
    ids = {g: [str(i) for i in range(8)] for g in ("sd15", "sdxl", "sd3")}
    units = {
        g: {
            m: {
                "itm/IR_c_mean": UnitScores(PAIR_UNITS, rng.normal(shift, 1, 8)),
                "itm/IR_c_median": UnitScores(PAIR_UNITS, rng.normal(shift, 1, 8), median=True),
            }
            for m in ("m1", "m2")
        }
        for g, shift in (("sd15", 0.0), ("sdxl", 0.8), ("sd3", 0.1))
    }
    bias = generator_bias(ids, units, ["m1", "m2"], 1000, 0)
    raw = [c.p_value for _, c in bias.comparisons]
    assert len(raw) == 2 * 2 * 3 and all(0 < p <= 1 for p in raw)
    order = np.argsort(raw)
    expected, running = [0.0] * len(raw), 0.0
    for rank, k in enumerate(order):
        running = max(running, min(1.0, (len(raw) - rank) * raw[k]))
        expected[k] = running
    assert [c.p_holm for _, c in bias.comparisons] == pytest.approx(expected, abs=1e-12)
    model = {k: {g: units[g]["m1"][k] for g in ids} for k in units["sd15"]["m1"]}
    alone = compare_dataset("counterfactuals", {g: {k: model[k][g] for k in model} for g in ids}, list(ids), 1000, 0)
    assert [c.p_value for c in alone] == [c.p_value for m, c in bias.comparisons if m == "m1"]


def test_without_resamples_there_is_no_test():
    """--bootstrap 0 (the generator-bias table allows it): no p-value, neither a random sign-flip
    test's (no pattern but the observed one) nor a bootstrap-t test's."""
    a, b = _better_everywhere(0, 12)
    tests = _compared(
        {
            "itm/IR_c_mean": (UnitScores("pairs", a), UnitScores("pairs", b)),
            "itm/IR_c_median": (UnitScores("pairs", a, median=True), UnitScores("pairs", b, median=True)),
        },
        resamples=0,
    )
    assert all(np.isnan(c.p_value) and not c.test for c in tests.values())


@pytest.mark.parametrize("linked", [False, True])
def test_two_proportions_are_tested_by_the_dual_of_their_newcombe_interval(linked):
    """Two models' fractions below zero on the same 6-40 units (real pairs' partners or none):
    the p-value is where Newcombe's 1 - p interval reaches 0 (the end nearest 0 is 0 there), so
    p < 0.05 exactly where the printed interval excludes 0. The fixture report's TR_r fraction
    below zero was tested by the dyadic-t on a near-0 se: p = 7e-17 and bold, its interval
    [-0.11, 0.62] holding 0; its fraction below zero printed "detectable with 80 % power: 2.7223"."""
    from training.statistics import newcombe
    from training.unit_scores import real_partners

    agreed = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(6, 40))
        z = rng.random(n)
        hits = [(z < 0.5 + 0.3 * rng.random()).astype(float), (z < 0.2 + 0.3 * rng.random()).astype(float)]
        partners = real_partners(n) if linked else None
        a, b = (UnitScores("real pairs", h, proportion=True, partners=partners) for h in hits)
        units = {"A": {"itm/TR_r_frac_below_zero": a}, "B": {"itm/TR_r_frac_below_zero": b}}
        (c,) = compare_dataset("cf", units, ["A", "B"], 200, 0)
        if c.note:
            continue
        assert c.test == "newcombe" and (c.low, c.high) == pytest.approx(newcombe(a, b))
        assert (c.p_value < 0.05) == (c.low > 0 or c.high < 0), (seed, c)
        assert not c.detectable > 1, c  # a difference of proportions is at most 1: none beyond
        if 1e-12 < c.p_value < 1:
            end = newcombe(a, b, 1 - c.p_value)[int(c.difference < 0)]
            assert end == pytest.approx(0, abs=1e-6), (seed, end)  # brentq: alpha to 2e-12
        agreed += 1
    assert agreed >= 30
