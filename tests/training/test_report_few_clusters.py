"""training/statistics.py at very few clusters (#42): below MIN_CLUSTERS (6) a mean, ratio,
median or mean over groups, and a paired difference of two models, gets no bootstrap interval
and says why (the bootstrap-t of 3 clusters printed [0.0002, 1905521.4843] for a mean of 0.016);
a proportion keeps its exact binomial interval; at and above the floor no resample's tiny
standard error blows the interval up."""

from __future__ import annotations

import numpy as np
import pytest

from training.statistics import FEW_CLUSTERS, MIN_CLUSTERS, UnitScores, intervals, paired_intervals

#: 6 pairs from 3 source images, as the report's clustered fixture (tests/training/test_report_small_n.py).
SOURCES = np.array([11, 11, 11, 22, 33, 33])


def test_a_bootstrap_interval_needs_six_clusters():
    rng = np.random.default_rng(3)
    values = rng.exponential(1, 6)
    metrics = {
        "mean": UnitScores("pairs", values, clusters=SOURCES),
        "median": UnitScores("pairs", values, median=True, clusters=SOURCES),
        "groups": UnitScores("images", values, groups=np.array([0, 0, 1, 1, 2, 2])),
        "five": UnitScores("pairs", values[:5]),
        "six": UnitScores("pairs", values),
        "hits": UnitScores("pairs", (values < 1).astype(float), clusters=SOURCES, proportion=True),
    }
    found = intervals(metrics, 1000, 0)
    for name in ("mean", "median", "five"):
        assert found[name].method == "none" and np.isnan([found[name].low, found[name].high]).all(), name
        assert found[name].note == f"fewer than {MIN_CLUSTERS} clusters", name
    assert (found["mean"].n, found["mean"].n_clusters) == (6, 3)
    # A mean over groups (the COCO 1K folds, per-class recall) resamples its units: 6 of them.
    assert found["groups"].method == "percentile" and found["six"].method == "studentized"
    assert found["six"].low < found["six"].high
    assert found["hits"].method == "clopper-pearson" and found["hits"].low < found["hits"].high


def test_a_paired_difference_needs_six_clusters_too():
    """compare_dataset (report.md's paired differences): 3 clusters give no interval, neither
    the studentized one of a mean's difference nor the percentile one of a median's, and no
    test: the smallest sign-flip p-value on 3 clusters, 2 / 2^3, cannot reach 0.05 (#50)."""
    from training.report.compare import compare_dataset

    rng = np.random.default_rng(5)
    units = {
        m: {
            "itm/TR_c_mean": UnitScores("pairs", x, clusters=SOURCES),
            "itm/TR_c_median": UnitScores("pairs", x, median=True, clusters=SOURCES),
        }
        for m, x in (("A", rng.normal(0, 0.05, 6)), ("B", rng.normal(0.1, 0.05, 6)))
    }
    for c in compare_dataset("cf", units, ["A", "B"], 1000, 0):
        assert np.isnan(c.low) and np.isnan(c.high) and c.n_clusters == 3, c.metric
        assert np.isnan(c.p_value) and np.isnan(c.p_holm) and c.note == FEW_CLUSTERS and not c.test


@pytest.mark.parametrize("n", [6, 10])
def test_no_resample_blows_the_interval_up_at_or_above_the_floor(n):
    """n - 1 near-equal values and one outlier (scores that barely differ, as a small model's):
    a third of the resamples miss the outlier, their se* is ~1e-9 and their t* ~1e8. The
    interval stays within 10 ranges of the values on each side of the mean
    (training.statistics.SE_FLOOR: a resample's se* is at least a tenth of the sample's);
    without the floor it reached ~1e8."""
    x = np.r_[np.arange(n - 1) * 1e-9, 1.0]
    found = intervals({"m": UnitScores("pairs", x)}, 1000, 0)["m"]
    assert found.method == "studentized" and found.low <= x.mean() <= found.high
    assert x.mean() - 10 * np.ptp(x) <= found.low and found.high <= x.mean() + 10 * np.ptp(x)


def test_the_trainers_metrics_md_says_why(tmp_path):
    """The trainer's final numbers (run.json's `final_interval_notes`, metrics.md) say it too:
    6 counterfactual pairs from 3 source images have no interval, 6 real pairs have one."""
    from types import SimpleNamespace

    from training.before_after import final_statistics
    from training.checkpoint import metric_table

    values = np.random.default_rng(2).normal(0.05, 0.1, 6)
    units = {
        "itm/IR_c_mean": UnitScores("pairs", values, clusters=SOURCES),
        "itm/IR_r_mean": UnitScores("pairs", values),
    }
    metrics = {k: u.value() for k, u in units.items()}
    cfg = SimpleNamespace(run=SimpleNamespace(bootstrap=200, seed=0))
    record = final_statistics(tmp_path, None, cfg, metrics, units, trained=False)
    assert record["final_interval_notes"] == {"itm/IR_c_mean": "fewer than 6 clusters"}
    assert list(record["final_intervals"]) == ["itm/IR_r_mean"]
    rows = metric_table(metrics, record["final_intervals"], record["final_interval_notes"]).splitlines()
    assert f"| itm/IR\\_c\\_mean | {metrics['itm/IR_c_mean']:.4f} (no interval: fewer than 6 clusters) |" in rows


def test_a_paired_difference_without_spread_has_no_interval_and_says_why():
    """compare_dataset: two models whose deltas differ by exactly 0.25 on each of 8 pairs give
    no interval and the single-model note, `all 8 units equal`, for the mean and the median
    alike, and no detectable difference (#50: 0.2500 [0.2500, 0.2500], `detectable with 80 %
    power: 0.0000`); a difference of metrics fixed by construction says that."""
    from training.report.compare import compare_dataset, comparison_cells

    x = np.arange(8) / 8
    units = {
        m: {"itm/IR_c_mean": UnitScores("pairs", v), "itm/IR_c_median": UnitScores("pairs", v, median=True)}
        for m, v in (("A", x + 0.25), ("B", x))
    }
    single = intervals({"d": UnitScores("pairs", np.full(8, 0.25))}, 1000, 0)["d"]
    found = {c.metric: c for c in compare_dataset("cf", units, ["A", "B"], 1000, 0)}
    for name in ("IR_c_mean", "IR_c_median"):
        c = found[name]
        assert np.isnan([c.low, c.high, c.detectable]).all() and c.note == single.note == "all 8 units equal", name
        assert comparison_cells(c).startswith("0.2500 (no interval: all 8 units equal) |"), name
    fixed = UnitScores("images", np.ones(8), proportion=True, trivial=True)
    r10 = paired_intervals({"r10": (fixed, fixed)}, 1000, 0)["r10"]
    assert np.isnan(r10.low) and (r10.trivial, r10.note) == (True, "fixed by construction")
