"""The UNet rows per caption pair behind the production table's GPU-days
(builders/devtools/production_rates.py, #43), against counts written out here."""

from __future__ import annotations

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
