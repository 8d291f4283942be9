"""The planning arithmetic behind the production table's GPU-days
(builders/devtools/production_plan.py, #43, #52 item 5), against counts and sums written out
here; and, through `benchmarks/gpu_check.py`'s entry point, that no GPU-days figure uses the
compiled row."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from builders.devtools.production_plan import (
    RELEASE_CAPTION_PAIRS,
    Assumptions,
    PlanCount,
    StageCosts,
    count_plan,
    gpu_days,
    gpu_seconds,
)

IDS = ["a", "b"]
REPO = Path(__file__).resolve().parents[2]


def test_paper_plan_rows_are_candidates_x_steps_x_four():
    # 100 candidates x 100 steps x (original + counterfactual) x (two guidance halves).
    assert count_plan(dict(candidates=100), False, IDS, 100).rows == 100 * 100 * 4
    # FLUX (no guidance halves) at schnell's 4 steps: 100 x 4 x 2.
    assert count_plan(dict(candidates=100), False, IDS, 4, halves=1).rows == 100 * 4 * 2


def test_paper_plan_counts_calls_decodes_and_scored_pairs():
    # Batches of candidate_batch = 4: 25 render calls, 16 rows a forward, both images of every
    # candidate decoded once at the end and every candidate CLIP-scored once.
    c = count_plan(dict(candidates=100), False, IDS, 50)
    assert (c.calls, c.forwards, c.decodes, c.scored) == (25, 25 * 50, 200, 100)
    assert c.rows_per_forward == 16


def test_early_rejection_of_every_candidate_keeps_the_steps_up_to_the_preview():
    every = Assumptions(reject_rate=1.0)
    c = count_plan(dict(candidates=100), False, IDS, 100, reject=every)
    # The preview after step 49 (0.5 x 99): 50 steps of every candidate, none after; each
    # candidate's two previews decoded and scored, nothing finished.
    assert (c.rows, c.decodes, c.scored) == (100 * 50 * 4, 200, 100)
    # Rejecting nobody costs the rows of the plan without rejection, plus the previews.
    c = count_plan(dict(candidates=7), False, IDS, 100, reject=Assumptions(reject_rate=1e-12))
    assert (c.rows, c.decodes, c.scored) == (7 * 100 * 4, 2 * 7 * 2, 7 * 2)


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
    c = count_plan(plan, True, ["a"], 100)
    assert n1 < n2 and c.rows == expected
    # At the end: one original image (shared) and two counterfactuals.
    assert (c.calls, c.decodes, c.scored) == (1, 3, 2)


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
    plan = dict(candidate_plan="grouped", seeds=10, p_values=10)
    assert count_plan(plan, True, IDS, steps).rows / 40_000 == pytest.approx(fraction, abs=0.01)


def test_gpu_days_add_every_stage():
    # Worked by hand: 40,000 rows at 200 rows/s slowed 1.25x by the injection = 250 s; 25 calls x
    # 0.1 s of text encoding = 2.5 s; 200 decodes x 0.05 s = 10 s; 100 pairs x 0.02 s = 2 s.
    count = PlanCount(rows=40_000, forwards=2_500, calls=25, decodes=200, scored=100)
    costs = StageCosts(text_s=0.1, vae_s=0.05, clip_s=0.02, rows_per_s={8: 100.0, 16: 200.0}, injection=1.25)
    assert gpu_seconds(count, costs) == pytest.approx(264.5)
    assert gpu_days(count, costs, Assumptions()) == pytest.approx(24_508 * 264.5 / 86_400)
    assert RELEASE_CAPTION_PAIRS == 24_508  # builders/counterfactuals/METHOD.md §2
    # The rate is read at the measured batch nearest the plan's rows a forward (13.7 -> 16).
    assert costs.rate_at(13.7) == (16, 200.0) and costs.rate_at(9.5) == (8, 100.0)


def test_sd15_counts_its_reference_steps():
    # The paper's 100 steps (Le et al. 2023 App. B.1.2), not diffusers' 50.
    from builders.devtools.production_plan import model_steps

    assert model_steps("sd15")[0] == ("stable-diffusion-v1-5/stable-diffusion-v1-5", 100)


def test_gpu_days_never_use_the_compiled_row(tmp_path, monkeypatch, capsys):
    """A compiled UNet 10^6 times faster than any other row moves no GPU-days figure: no build
    compiles the UNet (through gpu_check.py's entry point, the sweep and compile faked)."""
    from builders.devtools import production_rates
    from builders.devtools.production_rates import Row

    fast = Row("SD-1.5 P2P compiled", "fp32, 64 px, 2 pairs a batch, torch.compile", 1e9, "UNet rows/s")
    monkeypatch.setattr(production_rates, "compiled_row", lambda *a, **k: fast)
    sweep = [Row("SD-1.5 P2P", "fp32, 64 px, 2 pairs a batch (8 UNet rows), 3 steps", 10.0, "UNet rows/s")]
    monkeypatch.setattr(production_rates, "p2p_sweep", lambda *a, **k: list(sweep))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    assert gpu_check.main(["--cpu-tiny", "--generators", "sd15", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    compiled = [line for line in lines if line.startswith("| SD-1.5 P2P compiled |")]
    assert len(compiled) == 1, out
    days = [line for line in lines if re.search(r"\| GPU-days \|", line)]
    assert days, out
    assert not [line for line in days if "compiled" in line or "1e+09" in line or "1000000000" in line], days
