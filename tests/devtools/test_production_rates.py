"""The UNet rows per caption pair behind the production table's GPU-days
(builders/devtools/production_rates.py, #43), against counts written out here."""

from __future__ import annotations

import pytest

from builders.devtools.production_rates import plan_rows

IDS = ["a", "b"]


def test_paper_plan_rows_are_candidates_x_steps_x_four():
    # 100 candidates x 100 steps x (original + counterfactual) x (two guidance halves).
    assert plan_rows(dict(candidates=100), False, IDS) == 100 * 100 * 4


def test_early_rejection_of_every_candidate_keeps_the_steps_up_to_the_preview():
    # The preview after step 49 (0.5 x 99): 50 steps of every candidate, none after.
    assert plan_rows(dict(candidates=100), False, IDS, reject_rate=1.0) == 100 * 50 * 4
    # Rejecting nobody costs what the plan without rejection costs.
    assert plan_rows(dict(candidates=7), False, IDS, reject_rate=1e-12) == 7 * 100 * 4


def test_shared_grouped_plan_counts_each_row_state_once():
    # One seed x 2 p values, both injecting for n1 < n2 steps: the original branch once per step
    # (2 rows), the counterfactual branches shared until step n1, then forked.
    from builders.counterfactuals.config import ImageStageConfig
    from builders.counterfactuals.images import candidate_specs
    from builders.counterfactuals.prompt_to_prompt import injected_steps

    plan = dict(candidate_plan="grouped", seeds=1, p_values=2, candidate_batch=2)
    specs = candidate_specs(0, "a", ImageStageConfig(steps=100, **plan))
    n1, n2 = sorted(injected_steps(s.p, 100) for s in specs)
    # Counterfactual branches: one while both inject (steps < n1) and two from step n1 on.
    expected = 2 * 100 + 2 * (n1 + 2 * (100 - n1))
    assert n1 < n2 and plan_rows(plan, True, ["a"]) == expected


def test_method_mds_shared_steps_formula_matches_a_brute_force_count():
    """builders/counterfactuals/METHOD.md §2: a group of M candidates sharing (seed, guidance)
    costs about (2 + M(1 - p_mean)) / (2M) of the independent computation's rows (#52 item 5:
    the text had 4M, half the count). Brute force: at each step, 2 original rows and 2 rows per
    distinct counterfactual branch, a branch being the injected prefix min(n, step + 1)."""
    from builders.counterfactuals.config import ImageStageConfig
    from builders.counterfactuals.images import candidate_specs
    from builders.counterfactuals.prompt_to_prompt import injected

    steps, m = 100, 10
    cfg = ImageStageConfig(steps=steps, candidate_plan="grouped", seeds=1, p_values=m)
    p = [s.p for s in candidate_specs(0, "a", cfg)]
    n = [sum(injected(pj, i, steps) for i in range(steps)) for pj in p]
    shared = sum(2 + 2 * len({min(nj, i + 1) for nj in n}) for i in range(steps))
    fraction = shared / (4 * m * steps)
    p_mean = sum(p) / m
    assert fraction == pytest.approx((2 + m * (1 - p_mean)) / (2 * m), abs=0.01)
    assert fraction > 1.9 * (2 + m * (1 - p_mean)) / (4 * m)
    # The production plan's count (10 x 10, METHOD.md: 13,708 of 40,000 rows, 34.3 %).
    assert plan_rows(dict(candidate_plan="grouped", seeds=10, p_values=10), True, IDS) / 40_000 == pytest.approx(
        fraction, abs=0.01
    )
