"""ITM score deltas (builders/counterfactuals/METHOD.md §4) against a direct NumPy computation, stats, figure, bad inputs."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import torch

import counterfactory_metrics.itm_score_deltas.deltas as itm_module
from counterfactory_metrics.itm_score_deltas.deltas import delta_stats, itm_deltas, itm_score_deltas, plot_histograms

ARGS = ("g_cr_ir", "g_cr_io", "g_co_ir", "g_cc_ics", "g_cc_ios", "g_co_ics")


def _scores(seed: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.normal(size=n) for name in ARGS}


def test_docstring_examples():
    result = doctest.testmod(itm_module, raise_on_error=False)
    assert result.attempted >= 3 and result.failed == 0


@pytest.mark.parametrize("seed", range(5))
def test_deltas_and_stats_match_the_spec_formulas(seed):
    n = [1, 2, 7, 100, 1001][seed]
    s = _scores(seed, n)
    # builders/counterfactuals/METHOD.md §4, written out directly
    expected = {
        "IR_r": s["g_cr_ir"] - s["g_cr_io"],  # G(C_r, I_r) - G(C_r, I_o)
        "TR_r": s["g_cr_ir"] - s["g_co_ir"],  # G(C_r, I_r) - G(C_o, I_r)
        "IR_c": s["g_cc_ics"] - s["g_cc_ios"],  # G(C_c, I_c^s) - G(C_c, I_o^s)
        "TR_c": s["g_cc_ics"] - s["g_co_ics"],  # G(C_c, I_c^s) - G(C_o, I_c^s)
    }
    deltas = itm_deltas(**s)
    assert list(deltas) == ["IR_r", "TR_r", "IR_c", "TR_c"]
    for name, values in expected.items():
        np.testing.assert_array_equal(deltas[name], values)
    stats = itm_score_deltas(**{k: v.tolist() for k, v in s.items()})
    for name, values in expected.items():
        assert stats[name] == {
            "mean": pytest.approx(np.mean(values)),
            "median": pytest.approx(np.median(values)),
            "std": pytest.approx(np.std(values)),
            "frac_below_zero": pytest.approx(np.count_nonzero(values < 0) / len(values)),
            "count": len(values),
        }


def test_hand_computed_example_and_ties_at_zero():
    stats = delta_stats({"IR_c": np.array([-1.0, 0.0, 0.0, 3.0])})["IR_c"]
    assert stats.mean == 0.5 and stats.median == 0.0 and stats.count == 4
    assert stats.frac_below_zero == 0.25  # zero is not below zero
    assert stats.std == pytest.approx(np.sqrt((1.5**2 + 0.5**2 * 2 + 2.5**2) / 4))


def test_groups_can_be_given_separately_with_different_lengths():
    s = _scores(0, 10)
    cf = _scores(1, 4)
    only_random = itm_score_deltas(g_cr_ir=s["g_cr_ir"], g_cr_io=s["g_cr_io"], g_co_ir=s["g_co_ir"])
    assert set(only_random) == {"IR_r", "TR_r"}
    mixed = itm_deltas(
        g_cr_ir=s["g_cr_ir"], g_cr_io=s["g_cr_io"], g_cc_ics=torch.tensor(cf["g_cc_ics"]), g_co_ics=cf["g_co_ics"]
    )
    assert set(mixed) == {"IR_r", "TR_c"}
    assert mixed["IR_r"].shape == (10,) and mixed["TR_c"].shape == (4,)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(g_cr_ir=[1.0, 2.0], g_cr_io=[1.0]), "length mismatch for IR_r"),
        (dict(g_cr_ir=[1.0, np.nan], g_cr_io=[1.0, 2.0]), "g_cr_ir has 1 NaN"),
        (dict(g_cc_ics=[1.0], g_cc_ios=[np.inf]), "g_cc_ios has 1 NaN or infinite"),
        (dict(g_cr_ir=[], g_cr_io=[]), "empty"),
        (dict(g_cr_ir=[1.0], g_cc_ios=[1.0]), "without their partner"),
        (dict(g_cr_ir=[1.0], g_cr_io=[1.0], g_cc_ios=[2.0]), "g_cc_ios"),
        (dict(), "no delta can be computed"),
        (dict(g_cr_ir=[[1.0]], g_cr_io=[[1.0]]), "1-D"),
        (dict(g_cr_ir=["a"], g_cr_io=[1.0]), "numbers"),
    ],
)
def test_bad_inputs_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        itm_score_deltas(**kwargs)


def test_plot_histograms_writes_a_figure(tmp_path):
    deltas = itm_deltas(**_scores(3, 500))
    path = plot_histograms(deltas, tmp_path / "figs" / "itm.png", title="tiny model")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    only_ir = plot_histograms({"IR_r": deltas["IR_r"]}, tmp_path / "ir.pdf")
    assert only_ir.read_bytes()[:4] == b"%PDF"
    with pytest.raises(ValueError, match="unknown delta names"):
        plot_histograms({"XR_r": [1.0]}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="no deltas"):
        plot_histograms({}, tmp_path / "x.png")
