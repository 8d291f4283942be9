"""`--candidate-plan grouped --seeds K --p-values M`: K groups sharing seed and guidance, M
stratified p each; the build publishes the same pairs with shared computation as without it, for
any candidate batch, resumes to identical shards, and its manifest and card record the plan."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from datasets import load_dataset

from builders.counterfactuals.config import ImageStageConfig
from builders.counterfactuals.images import candidate_batches, candidate_specs
from builders.counterfactuals.prompt_to_prompt import PairSpec
from builders.app.cli import main as cli_main
from builders.engine.seeding import derive_seed

from helpers.build_helpers import shard_digests

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

GROUPED = ["--candidate-plan", "grouped", "--seeds", "2", "--p-values", "3", "--image-size", "64", "--steps", "4"]


def test_grouped_plan_draws_stratified_p_per_shared_seed_and_guidance():
    cfg = ImageStageConfig(candidate_plan="grouped", seeds=4, p_values=5, p_range=(0.1, 0.9))
    assert cfg.candidates == 20
    specs = candidate_specs(3, "42_1", cfg)
    assert len(specs) == 20 and candidate_specs(3, "42_1", cfg) == specs
    assert candidate_specs(3, "42_2", cfg) != specs
    for k in range(4):
        group = specs[5 * k : 5 * k + 5]
        assert {s.seed for s in group} == {derive_seed(3, "42_1", "group", k)}
        assert len({s.guidance for s in group}) == 1 and 7.5 <= group[0].guidance <= 15
        # One p in each of the 5 equal slices of (0.1, 0.9), in increasing order.
        for m, spec in enumerate(group):
            assert 0.1 + 0.16 * m <= spec.p <= 0.1 + 0.16 * (m + 1)
    assert len({s.seed for s in specs}) == 4
    # The independent plan is the paper's: a seed per candidate, unchanged by the new fields.
    independent = candidate_specs(3, "42_1", ImageStageConfig(candidates=3, seeds=9, p_values=9))
    want = []
    for j in range(3):
        seed = derive_seed(3, "42_1", "candidate", j)
        rng = random.Random(seed)
        want.append(PairSpec(seed, rng.uniform(0.1, 0.9), rng.uniform(7.5, 15.0)))
    assert independent == want


def test_batches_hold_whole_groups():
    a, b, c = PairSpec(1, 0.2, 8.0), PairSpec(1, 0.5, 8.0), PairSpec(2, 0.3, 9.0)
    d = PairSpec(1, 0.7, 9.0)  # seed 1 again, other guidance: another group
    specs = [a, b, c, d, a]
    assert candidate_batches(specs, 1) == [[a, b], [c], [d], [a]]
    assert candidate_batches(specs, 3) == [[a, b, c], [d, a]]
    assert candidate_batches(specs, 10) == [specs]
    assert [x for batch in candidate_batches(specs, 2) for x in batch] == specs


def build(out: Path, coco: Path, tiny: Path, *extra: str) -> int:
    return cli_main(
        [
            "build",
            "coco-counterfactuals",
            "--coco-root",
            str(coco),
            "--karpathy-splits",
            "test",
            "--max-captions",
            "4",
            "--models",
            "tiny",
            "--tiny-models-dir",
            str(tiny),
            "--output",
            str(out),
            "--part-size",
            "2",
            *extra,
        ]
    )


def test_grouped_build_shares_work_without_changing_the_pairs(
    coco_fixture_dir, tiny_models_dir, nltk_data_dir, tmp_path
):
    shared = tmp_path / "shared"
    assert build(shared, coco_fixture_dir, tiny_models_dir, *GROUPED, "--candidate-batch", "6") == 0
    # The independent computation of the same candidates, one group per UNet batch.
    alone = tmp_path / "alone"
    assert (
        build(alone, coco_fixture_dir, tiny_models_dir, *GROUPED, "--candidate-batch", "1", "--no-shared-computation")
        == 0
    )
    rows, reference = load_dataset(str(shared), split="test"), load_dataset(str(alone), split="test")
    assert len(rows) >= 2 and rows["id"] == reference["id"]
    cfg = ImageStageConfig(candidate_plan="grouped", seeds=2, p_values=3)
    for row, ref in zip(rows, reference, strict=True):
        assert row["image_candidates_tried"] == row["image_candidates_passed"] == 6
        # The published candidate is one of the row's grouped specs, and the same one.
        assert PairSpec(row["seed"], row["p"], row["guidance_scale"]) in candidate_specs(0, row["id"], cfg)
        assert (row["seed"], row["p"], row["guidance_scale"]) == (ref["seed"], ref["p"], ref["guidance_scale"])
        for name in ("clip_score_0", "clip_score_1", "clip_directional", "clip_image_similarity"):
            assert row[name] == pytest.approx(ref[name], abs=1e-4), name
        for name in ("image_0", "image_1"):
            a, b = (np.asarray(r[name]).astype(int) for r in (row, ref))
            assert np.abs(a - b).max() <= 1, name

    manifest = json.loads((shared / "build_manifest.json").read_text())
    images = manifest["config"]["images"]
    assert (images["candidate_plan"], images["seeds"], images["p_values"], images["candidates"], images["share"]) == (
        "grouped",
        2,
        3,
        6,
        True,
    )
    card = " ".join((shared / "README.md").read_text().split())
    assert "draws 6 candidate pairs per caption pair" in card
    assert "Candidate plan `grouped`: 2 groups of 3 candidates" in card
    assert json.loads((alone / "build_manifest.json").read_text())["config"]["images"]["share"] is False

    # A crash after part 0 (stats gone, part file truncated) resumes to identical shards.
    digests = shard_digests(shared)
    (shared / ".parts/stats/part-00000.json").unlink()
    part = shared / ".parts/default/test/part-00000.parquet"
    part.write_bytes(part.read_bytes()[:100])
    assert build(shared, coco_fixture_dir, tiny_models_dir, *GROUPED, "--candidate-batch", "6") == 0
    assert shard_digests(shared) == digests


@pytest.mark.parametrize(
    "flags,wrong",
    [(["--candidate-plan", "grouped", "--candidates", "5"], "--candidates"), (["--seeds", "3"], "--seeds")],
)
def test_options_of_the_other_plan_are_refused(flags, wrong, tmp_path, coco_fixture_dir, tiny_models_dir, capsys):
    assert build(tmp_path / "out", coco_fixture_dir, tiny_models_dir, *flags) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{wrong} does not apply to --candidate-plan" in err
    assert not (tmp_path / "out").exists()
