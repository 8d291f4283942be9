"""The empirical-likelihood statistic of benchmarks/mean_test_alternatives.py against independent
references: the closed form at n = 2 and a brute-force constrained maximisation of sum log(n p_i)
(Owen 1988, Biometrika 75:237-249); the adjusted EL (Chen, Variyath & Abraham 2008) is finite
where plain EL is not."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from scipy import optimize

SPEC = importlib.util.spec_from_file_location(
    "mean_test_alternatives", Path(__file__).parents[2] / "benchmarks" / "mean_test_alternatives.py"
)
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def test_el_at_n2_is_the_closed_form() -> None:
    # mean 0 on {a, b}, a < 0 < b, forces p_a = b / (b - a), p_b = -a / (b - a).
    a, b = -0.7, 2.3
    expected = -2 * (np.log(2 * b / (b - a)) + np.log(2 * -a / (b - a)))
    assert abs(bench.el_statistic(np.array([[a, b]]))[0] - expected) < 1e-12


def test_el_matches_a_brute_force_maximisation() -> None:
    rng = np.random.default_rng(3)
    for n in (5, 12):
        x = rng.exponential(1, n) - 1
        x[0], x[1] = -0.9, 2.0  # 0 inside the hull
        result = optimize.minimize(
            lambda p: -np.log(n * p).sum(),
            np.full(n, 1 / n),
            method="SLSQP",
            bounds=[(1e-12, 1)] * n,
            constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1}, {"type": "eq", "fun": lambda p: p @ x}],
            options={"ftol": 1e-14, "maxiter": 500},
        )
        assert abs(bench.el_statistic(x[None])[0] - 2 * result.fun) < 1e-7


def test_outside_the_hull_el_rejects_and_the_adjusted_el_does_not_by_construction() -> None:
    x = -np.array([[0.1, 0.5, 1.0, 2.0]])
    assert np.isinf(bench.el_statistic(x)[0])
    assert bench.el(x, None, 0)[0] == 0.0
    assert 0 < bench.adjusted_el(x, None, 0)[0] < 1
