"""What `counterfactory benchmark`'s report.md says beside its numbers (#42): n on every table,
plot and record, small samples marked, per-class numbers on their own units and in a Holm family
of their own, no equivalence wording, ODmAP's chance level in closed form, what a text-only prior
can inflate, and PN's floor below 0."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from training.statistics import UnitScores, holm

N = 60  # queries of the fixtures below


def _units(rng, shift: float) -> dict[str, UnitScores]:
    """One model's per-unit scores on N queries: two table metrics and three per-class ones
    (`dog`: 40 queries, `cat`: 3, PN of `dog`: 40)."""
    dog = (np.arange(N) < 40).astype(float)
    cat = (np.arange(N) >= N - 3).astype(float)
    ap = np.clip(rng.random(N) + shift, 0, 1)
    pn = rng.normal(shift, 0.1, N)
    return {
        "odmap/ODmAP@1": UnitScores("decorrelation queries", ap),
        "necessity/PN_mean": UnitScores("removal pairs", pn * dog, dog),
        "necessity/PN_dog": UnitScores("removal pairs", pn * dog, dog),
        "odmap_per_class/dog_ODmAP@1": UnitScores("decorrelation queries", ap * dog, dog),
        "odmap_per_class/cat_ODmAP@1": UnitScores("decorrelation queries", ap * cat, cat),
    }


@pytest.fixture()
def two_models():
    from training.report.per_class import class_units

    rng = np.random.default_rng(0)
    return {"a": class_units(_units(rng, 0.0)), "b": class_units(_units(rng, 0.05))}


def test_a_class_has_its_own_units_and_no_interval_below_the_minimum(two_models):
    from training.statistics import MIN_CLUSTERS
    from training.report.run import BenchmarkConfig, _intervals

    units = two_models["a"]
    assert units["odmap_per_class/dog_ODmAP@1"].n == 40 and units["necessity/PN_dog"].n == 40
    assert units["odmap_per_class/cat_ODmAP@1"].n == 3 < MIN_CLUSTERS
    assert units["odmap/ODmAP@1"].n == N  # a table metric keeps the whole set
    assert units["necessity/PN_mean"].n == 40  # queries without a PN value are no unit of it
    # The same value on the class's own units.
    dog = np.arange(N) < 40
    raw = _units(np.random.default_rng(0), 0.0)
    assert units["necessity/PN_dog"].value() == pytest.approx(raw["necessity/PN_dog"].num[dog].mean())
    intervals = _intervals(units, BenchmarkConfig(models=[], sources={}, output="", bootstrap=200))
    cat = intervals["odmap_per_class/cat_ODmAP@1"]
    assert np.isnan(cat.low) and np.isnan(cat.high) and cat.n == 3
    dog = intervals["necessity/PN_dog"]
    assert dog.low < dog.high and dog.n == 40  # resamples of the class's queries: never a point interval


def test_the_table_family_is_exactly_its_columns_and_classes_have_their_own(two_models):
    from training.report.compare import compare_dataset
    from training.report.markdown import comparison_columns
    from training.report.results import record_name

    table = compare_dataset("decorrelation", two_models, ["a", "b"], 300, 0)
    records = [
        {"dataset": "decorrelation", "model": m, "task": t, "metrics": {n: 0.0}}
        for m in two_models
        for t, n in map(record_name, two_models[m])
    ]
    assert {(c.task, c.metric) for c in table} == set(comparison_columns(records, "decorrelation"))
    assert [c.p_holm for c in table] == pytest.approx(list(holm([c.p_value for c in table])))
    classes = compare_dataset("decorrelation", two_models, ["a", "b"], 300, 0, per_class=True)
    by_metric = {c.metric: c for c in classes}
    assert set(by_metric) == {"PN_dog", "dog_ODmAP@1", "cat_ODmAP@1"}
    assert by_metric["PN_dog"].n == 40 and by_metric["cat_ODmAP@1"].n == 3
    # Too few units: no interval, no test, and no place in the family.
    cat = by_metric["cat_ODmAP@1"]
    assert np.isnan(cat.p_value) and np.isnan(cat.p_holm) and np.isnan(cat.low)
    tested = [c for c in classes if np.isfinite(c.p_value)]
    assert [c.p_holm for c in tested] == pytest.approx(list(holm([c.p_value for c in tested])))


def _record(model: str, value: float, n: int, low: float, high: float) -> dict:
    name = "text_retrieval_recall@1"
    return {
        "dataset": "coco",
        "task": "zeroshot_retrieval",
        "model": model,
        "metrics": {name: value},
        "ci_low": {name: low},
        "ci_high": {name: high},
        "n_units": {name: n},
        "chance": {name: 0.1},
    }


def test_no_winner_is_no_significant_difference_once_with_its_n():
    from training.report.markdown import Extras, comparison_table, render_report

    key = ("zeroshot_retrieval", "text_retrieval_recall@1")
    records = [
        {**_record("a", 0.5, 6, 0.2, 0.8), "dataset_source": "x", "weights_digest": "sha256:a"},
        {**_record("b", 0.3, 6, 0.0, 0.6), "dataset_source": "x", "weights_digest": "sha256:b"},
    ]
    lines = comparison_table(records, "coco", ["a", "b"], {key: ("a", False)})
    text = "\n".join(lines)
    assert "(tie)" not in text and "**" not in text
    assert lines[-3] == "| *n (units)* | 6, small sample |"
    assert lines[-2] == "| *best vs runner-up* | no significant difference (n = 6, small sample) |"
    assert text.count("no significant difference") == 1
    won = comparison_table(records, "coco", ["a", "b"], {key: ("a", True)})
    assert won[2].count("**") == 2 and "no significant difference" not in "\n".join(won)
    # Untested (one model, --bootstrap 0): report.md bolds nothing.
    md = render_report(records, Extras())
    assert "**0.5000" not in md and "cannot be told apart" not in md and "(tie)" not in md
    assert "| *n (units)* | 6, small sample |" in md
    big = [_record("a", 0.5, 1000, 0.45, 0.55)]
    assert "| *n (units)* | 1,000 |" in comparison_table(big, "coco", ["a"], {})


def test_a_column_without_a_winner_gives_the_difference_its_test_could_detect():
    """Paired differences with standard deviation 1 on 400 units: a two-sided test at 0.05 has
    80 % power at (z(0.975) + z(0.8)) / sqrt(400) = 0.140 (normal approximation, from the
    differences themselves, not the bootstrap)."""
    from statistics import NormalDist

    from training.report.compare import compare_dataset, verdicts
    from training.report.markdown import comparison_table

    rng = np.random.default_rng(0)
    a = rng.normal(0, 1, 400)
    b = a + rng.normal(0, 1, 400)
    units = {m: {"itm/IR_c_mean": UnitScores("pairs", v)} for m, v in (("a", a), ("b", b))}
    (test,) = compare_dataset("cf", units, ["a", "b"], 2000, 0)
    z = NormalDist().inv_cdf
    expected = (z(0.975) + z(0.8)) * np.std(a - b, ddof=1) / np.sqrt(400)
    assert test.detectable == pytest.approx(expected, rel=0.1)
    records = [
        {"dataset": "cf", "task": "itm", "model": m, "metrics": {"IR_c_mean": u["itm/IR_c_mean"].value()}}
        for m, u in units.items()
    ]
    found = verdicts(records, "cf", [test])
    assert not found[("itm", "IR_c_mean")][1]  # equal in distribution: this seed does not reject
    row = comparison_table(records, "cf", ["a", "b"], found)[-1]
    assert f"detectable with 80 % power: {test.detectable:.4f})" in row


def test_clusters_are_shown_where_they_differ_from_units():
    from training.report.markdown import sample_size

    assert sample_size(40, 12) == "40 in 12 clusters, small sample"
    assert sample_size(400, 400) == "400"
    assert sample_size(None) == "n/a"


def test_no_equivalence_wording_left_in_the_report_code_or_docs():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = [*root.glob("training/report/*.py"), root / "docs" / "report.md"]
    for path in files:
        text = path.read_text()
        assert "cannot be told apart" not in text and "(tie)" not in text, path


# ---------------------------------------------------------------------------- ODmAP chance


def test_expected_ap_equals_exhaustive_enumeration():
    from counterfactory_metrics.odmap.odmap_scores import average_precision_at_k
    from training.report.floors import expected_ap

    for gallery, relevant, k in ((5, 2, 3), (6, 1, 6), (5, 0, 2), (4, 4, 3), (6, 3, 4)):
        rel = np.arange(gallery) < relevant
        perms = np.array(list(itertools.permutations(range(gallery))))
        exact = average_precision_at_k(rel[perms], [k])[k].mean()
        assert expected_ap(np.array([relevant]), gallery, k)[0] == pytest.approx(exact, abs=1e-12)


def test_odmap_chance_is_the_mean_of_100000_random_rankings():
    """On a synthetic decorrelation set: the closed form is within 4 standard errors of 100,000
    random rankings scored by the odmap module."""
    from counterfactory_metrics.odmap.odmap_scores import odmap_from_topk
    from training.evaluation import class_matrix, odmap_classes
    from training.report.floors import odmap_chance

    mentions = [["dog"], ["cat"], ["dog", "cat"], ["car"], ["car", "dog"], ["tree"], ["cat"], ["car"], [], ["tree"]]
    data = SimpleNamespace(
        gallery_captions=[f"caption {i}" for i in range(len(mentions))],
        gallery_mentions=mentions,
        removed=[["dog"], ["cat"], ["car"]],
        present=[["cat"], ["car", "tree"], ["dog"]],
    )
    closed = odmap_chance(data, (1, 5, 10))
    classes = odmap_classes(data)
    rng = np.random.default_rng(0)
    draws = 100_000
    gallery = len(mentions)
    queries = len(data.removed)
    top = np.argsort(rng.random((draws * queries, gallery)), axis=1)
    result = odmap_from_topk(
        top,
        class_matrix(mentions, classes),
        np.repeat(class_matrix(data.removed, classes), draws, 0),
        np.repeat(class_matrix(data.present, classes), draws, 0),
        k_values=(1, 5, 10),
    )
    for k, ap in result.per_query.items():
        per_draw = ap.reshape(queries, draws).mean(0)  # ODmAP@k of one random ranking per query
        se = per_draw.std(ddof=1) / np.sqrt(draws)
        assert abs(closed[f"odmap/ODmAP@{k}"] - per_draw.mean()) < 4 * se, k


# ---------------------------------------------------------------------------- blind baseline


def test_a_text_prior_cancels_in_ir_c_and_inflates_tr_c_only_when_it_favours_the_counterfactual():
    """A planted caption set: every counterfactual caption is the more fluent one. A model whose
    score is an image-text part plus that prior keeps its IR_c and gains exactly the prior's
    difference on TR_c; the report's blind section names TR_c, never IR_c."""
    from counterfactory_metrics.itm_score_deltas.deltas import itm_deltas
    from training.report.floors import _prefers, prior_effect
    from training.report.markdown import blind_lines

    rng = np.random.default_rng(1)
    originals = [f"a {w} sits on the bench bench bench" for w in ("dog", "cat", "man", "bird")] * 5
    counterfactuals = [f"a {w} sits on the bench" for w in ("horse", "cow", "girl", "duck")] * 5
    prior = {c: -0.01 * len(c.split()) for c in originals + counterfactuals}  # shorter: more fluent
    p_o = np.array([prior[c] for c in originals])
    p_c = np.array([prior[c] for c in counterfactuals])
    n = len(originals)
    cc_ic, cc_io, co_ic = rng.normal(0.3, 0.05, (3, n))  # G(C_c, I_c), G(C_c, I_o), G(C_o, I_c)
    blind = itm_deltas(g_cc_ics=cc_ic, g_cc_ios=cc_io, g_co_ics=co_ic)
    seen = itm_deltas(g_cc_ics=cc_ic + p_c, g_cc_ios=cc_io + p_c, g_co_ics=co_ic + p_o)
    np.testing.assert_allclose(seen["IR_c"], blind["IR_c"])
    np.testing.assert_allclose(seen["TR_c"] - blind["TR_c"], p_c - p_o)
    assert (p_c - p_o > 0).all()  # the prior favours the counterfactual: TR_c inflated
    prefers = float(_prefers(p_o, p_c, higher=True).mean())
    assert prefers == 0.0
    high = 1 - 0.025 ** (1 / n)  # 0 of 20: Clopper-Pearson's upper end, by hand
    assert prior_effect(prefers, 0.0, high).startswith("TR_c") and "IR_c" not in prior_effect(prefers, 0.0, high)
    assert prior_effect(1.0, 1 - high, 1.0).startswith("none") and "lowers TR_c" in prior_effect(1.0, 1 - high, 1.0)
    # A direction is claimed only where the interval excludes 0.5: 0.4 [0.19, 0.64] claims none.
    assert prior_effect(0.4, 0.19, 0.64) == prior_effect(0.6, 0.36, 0.81) == "none shown (its interval holds 0.5)"
    assert prior_effect(0.0) == "none shown (no interval)"
    record = {
        "dataset": "cf",
        "task": "blind_baseline",
        "model": "lm",
        "metrics": {"lm_prefers_original": prefers, "pairs": n, "same_word_pairs": 0},
        "n_units": {"lm_prefers_original": n},
        "ci_low": {"lm_prefers_original": 0.0},
        "ci_high": {"lm_prefers_original": high},
        "chance": {"lm_prefers_original": 0.5},
    }
    text = "\n".join(blind_lines([record], "cf"))
    row = next(line for line in text.splitlines() if line.startswith("| lm | lm\\_prefers"))
    assert row.endswith("| TR_c (the prior favours the counterfactual caption) |") and "n = 20" in row
    assert "cannot inflate IR_c" in text and "either way" not in text


# ---------------------------------------------------------------------------- PN floor


def test_pn_floor_of_a_model_without_preference_is_below_zero():
    """s_x, s_x' iid uniform on [0.5, 1] (no preference): E[PN] = 1 - E[s_x'] E[1/s_x] =
    1 - 0.75 * 2 ln 2 = -0.0397, which the floor recovers from the scores; the chance level the
    report shows for PN is that floor, not 0."""
    from training.report.floors import chance_levels, pn_floor

    rng = np.random.default_rng(0)
    s_x, s_xp = rng.uniform(0.5, 1, (2, 200_000))
    pn = (s_x - s_xp) / s_x
    values = [(i, "dog" if i % 2 else "cat", float(v)) for i, v in enumerate(pn)]
    floor = pn_floor(values)
    exact = 1 - 0.75 * 2 * np.log(2)
    assert floor["necessity/PN_mean"] == pytest.approx(exact, abs=5e-4)
    assert pn.mean() == pytest.approx(exact, abs=2e-3)  # the model's own PN sits at the floor
    assert floor["necessity/PN_dog"] < 0 and floor["necessity/PN_cat"] < 0
    # Equal scores: no gap, the floor is 0.
    assert pn_floor([(0, "dog", 0.0)])["necessity/PN_dog"] == 0.0
    data = SimpleNamespace(retrieval=None, queries=None)
    metrics = {"necessity/PN_mean": float(pn.mean()), "necessity/PN_dog": 0.0, "necessity/PN_cat": 0.0}
    chance = chance_levels(metrics, data, (1,), values)
    assert chance["necessity/PN_mean"] == pytest.approx(exact, abs=5e-4)


def test_the_class_minimum_is_the_fewest_units_a_sign_flip_test_can_reject_at():
    """scipy's exact paired permutation test on the most extreme data (every unit favours one
    model): it cannot reject at 0.05 below MIN_CLUSTERS units, and can at it."""
    from scipy.stats import permutation_test

    from training.statistics import MIN_CLUSTERS

    def smallest_p(n: int) -> float:
        def mean_difference(x, y):
            return np.mean(x - y)

        x, y = np.arange(1.0, n + 1), np.zeros(n)
        return permutation_test((x, y), mean_difference, permutation_type="samples").pvalue

    assert smallest_p(MIN_CLUSTERS - 1) > 0.05 >= smallest_p(MIN_CLUSTERS)
