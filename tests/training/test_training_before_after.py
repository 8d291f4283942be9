"""The cost of finetuning (#35): the trainer evaluates the base model before step 1 on every
configured evaluation, and metrics.md, run.json and the model card show before -> after with the
difference's paired interval; the final metrics carry their intervals; a sweep aggregates the
per-seed gains with a paired test across seeds."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from helpers.training_helpers import final_metrics, read_jsonl, write_color_set, write_counterfactuals
from training.finetune_clip import main as train_main

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


@pytest.fixture(scope="module")
def colors(tmp_path_factory):
    root = tmp_path_factory.mktemp("colors")
    data = write_color_set(root / "colors", {"train": 2, "val": 1, "test": 1})
    # Test image ids are 25..32 (8 colours per split): one counterfactual pair each.
    return data, write_counterfactuals(root / "cf", list(range(25, 33)))


def test_before_after_in_metrics_md_run_json_and_card(colors, tiny_models_dir, tmp_path):
    data, cf = colors
    common = [
        "--real",
        str(data),
        "--real-train-splits",
        "train",
        "--counterfactuals",
        str(cf),
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--num-workers",
        "0",
        "--bootstrap",
        "300",
    ]
    out = tmp_path / "run"
    assert train_main([*common, "--batch-size", "16", "--lr", "2e-3", "--max-steps", "15", "--output", str(out)]) == 0
    base = tmp_path / "base"
    assert train_main([*common, "--eval-only", "--output", str(base)]) == 0
    record = json.loads((out / "run.json").read_text())
    before, final = record["before_metrics"], final_metrics(out)
    # The base model's numbers are those --eval-only gives for it (which has no validation loss).
    evaluated = final_metrics(base)
    assert set(before) == {*evaluated, "val_loss"}
    assert {k: before[k] for k in evaluated} == pytest.approx(evaluated, abs=1e-6)
    rows = record["before_after"]
    assert {
        "zeroshot_retrieval/image_retrieval_recall@1",
        "itm/IR_c_mean",
        "itm/TR_r_median",
        "val_loss",
    } <= rows.keys()
    moved = 0
    for key, row in rows.items():
        assert row["before"] == pytest.approx(before[key]) and row["after"] == pytest.approx(final[key])
        assert row["difference"] == pytest.approx(final[key] - before[key])
        if key == "val_loss":
            assert row["ci_low"] is None  # no per-unit form
            continue
        if row["ci_low"] is None:  # a difference without spread, or fixed by construction (#50)
            assert re.fullmatch(r"all [\d,]+ units equal|fixed by construction", row["ci_note"]), key
            continue
        assert row["ci_low"] - 1e-9 <= row["difference"] <= row["ci_high"] + 1e-9, key
        moved += row["difference"] != 0
    assert moved, "training changed no metric"
    assert (
        rows["zeroshot_retrieval/image_retrieval_recall@1"]["difference"] > 0
    )  # the captions name the colour: it learns
    for text in ((out / "metrics.md").read_text(), (out / "final" / "README.md").read_text()):
        assert "## Before -> after (the base model evaluated before step 1)" in text
        row = next(
            line
            for line in text.splitlines()
            if line.startswith("| zeroshot\\_retrieval/image\\_retrieval\\_recall@1 |") and line.count("|") == 5
        )
        assert (
            f"| {before['zeroshot_retrieval/image_retrieval_recall@1']:.4f} | {final['zeroshot_retrieval/image_retrieval_recall@1']:.4f} |"
            in row
        )
        assert re.search(r"\[-?\d\.\d{4}, -?\d\.\d{4}\] \|$", row), row
    low, high = record["final_intervals"]["zeroshot_retrieval/image_retrieval_recall@1"]
    assert low <= final["zeroshot_retrieval/image_retrieval_recall@1"] <= high
    assert (
        f"| zeroshot\\_retrieval/image\\_retrieval\\_recall@1 | {final['zeroshot_retrieval/image_retrieval_recall@1']:.4f} [{low:.4f}, {high:.4f}] |"
        in (out / "metrics.md").read_text()
    )
    # metrics.jsonl keeps its rows (the base model's are in before.json).
    assert all(e["step"] > 0 for e in read_jsonl(out / "metrics.jsonl"))
    # --eval-only has no "before".
    assert json.loads((base / "run.json").read_text())["before_after"] == {}


def test_sweep_aggregates_the_per_seed_gains(tmp_path):
    from scipy import stats

    from training.sweep import summarize

    gains = {1: 0.02, 2: 0.05, 3: 0.03}
    for seed, gain in gains.items():
        folder = tmp_path / f"seed-{seed}"
        folder.mkdir()
        final = {"zeroshot_retrieval/image_retrieval_recall@1": 0.5 + gain, "val_loss": 1.0}
        before_after = {
            "zeroshot_retrieval/image_retrieval_recall@1": {
                "before": 0.5,
                "after": 0.5 + gain,
                "difference": gain,
                "ci_low": None,
                "ci_high": None,
            }
        }
        (folder / "run.json").write_text(json.dumps({"final_metrics": final, "before_after": before_after}))
    summary = summarize(tmp_path)
    row = next(r for r in summary["metrics"] if r["metric"] == "zeroshot_retrieval/image_retrieval_recall@1")
    g = np.array(list(gains.values()))
    assert row["gain_mean"] == pytest.approx(g.mean()) and row["gain_std"] == pytest.approx(g.std(ddof=1))
    assert row["gain_p"] == pytest.approx(stats.ttest_1samp(g, 0.0).pvalue)
    table = (tmp_path / "summary.md").read_text()
    assert "gain (after - before) mean ± std | paired p |" in table
    assert f"+{g.mean():.4f} ± {g.std(ddof=1):.4f}" in table
    assert next(r for r in summary["metrics"] if r["metric"] == "val_loss").get("gain_mean") is None


def test_zeroshot_and_flickr30k_are_evaluated_before_step_1(colors, tiny_models_dir, tmp_path):
    """Every configured evaluation has its before -> after: zero-shot (units: test images) and
    Flickr30k (units: images with all their captions) too, each with its paired interval."""
    from builders.devtools.fixtures.classification import write_classification_fixture
    from builders.devtools.fixtures.coco import CocoFixtureConfig, write_flickr30k_fixture

    data, _ = colors
    classes = write_classification_fixture(tmp_path / "classes", per_class=1)
    # 6 test images: the fewest clusters a paired interval is made from (statistics.MIN_CLUSTERS).
    flickr = write_flickr30k_fixture(tmp_path / "f30k", CocoFixtureConfig(n_images=8, test_fraction=0.75))
    out = tmp_path / "run"
    assert (
        train_main(
            [
                "--real",
                str(data),
                "--real-train-splits",
                "train",
                "--zeroshot",
                f"{classes}:test",
                "--flickr30k",
                str(flickr),
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--num-workers",
                "0",
                "--bootstrap",
                "200",
                "--batch-size",
                "16",
                "--max-steps",
                "3",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads((out / "run.json").read_text())["before_after"]
    for key in (
        "zeroshot/classes-test/top1",
        "zeroshot/classes-test/mean_per_class_recall",
        "flickr30k/image_retrieval_recall@1",
        "flickr30k/text_retrieval_recall@5",
    ):
        row = rows[key]
        assert row["difference"] == pytest.approx(row["after"] - row["before"]), key
        if row["ci_low"] is None:  # e.g. top-1 unchanged on every test image: no spread (#50)
            assert row["ci_note"].endswith("units equal") and row["difference"] == 0, key
            continue
        assert row["ci_low"] - 1e-9 <= row["difference"] <= row["ci_high"] + 1e-9, key


def test_final_intervals_are_made_as_the_report_makes_them(tmp_path):
    """The trainer's own intervals at small n (#42): R@1 with no hit in 6 images is the exact
    Clopper-Pearson [0, 0.459] (the percentile bootstrap gave [0, 0]), and an R@K that every
    image hits by construction gets no interval instead of [1, 1]; nor do 6 equal deltas, which
    metrics.md calls a sample without spread, not a value fixed by construction."""
    from types import SimpleNamespace

    from scipy import stats

    from training.before_after import final_statistics
    from training.checkpoint import metric_table
    from training.statistics import UnitScores

    units = {
        "zeroshot_retrieval/image_retrieval_recall@1": UnitScores("images", np.zeros(6), proportion=True),
        "zeroshot_retrieval/image_retrieval_recall@10": UnitScores(
            "images", np.ones(6), proportion=True, trivial=True
        ),
    }
    units["itm/IR_c_mean"] = UnitScores("pairs", np.full(6, 0.25))
    metrics = {k: u.value() for k, u in units.items()}
    cfg = SimpleNamespace(run=SimpleNamespace(bootstrap=200, seed=0))
    record = final_statistics(tmp_path, None, cfg, metrics, units, trained=False)
    found = record["final_intervals"]
    # metrics.md's rows (metric names as plain Markdown: `_` escaped).
    rows = metric_table(metrics, found, record["final_interval_notes"]).splitlines()
    assert "| itm/IR\\_c\\_mean | 0.2500 (no interval: all 6 units equal) |" in rows
    r10 = "zeroshot\\_retrieval/image\\_retrieval\\_recall@10"
    assert f"| {r10} | 1.0000 (no interval: fixed by construction) |" in rows
    exact = stats.binomtest(0, 6).proportion_ci(0.95, method="exact")
    assert found["zeroshot_retrieval/image_retrieval_recall@1"] == pytest.approx([exact.low, exact.high])
    assert "zeroshot_retrieval/image_retrieval_recall@10" not in found
