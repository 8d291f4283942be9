"""`counterfactory benchmark --coco` on the COCO 5K test split (the real 5,000 test image ids and
their 25,000 caption ids, as tiny images): the report adds the ECCV Caption suite, CxC and, with
`--coco-instances`, PMRP, and every number equals `finetune_clip.py --eval-only --eccv
--coco-instances` on the same build. Another split with `--coco-instances` is one line."""

from __future__ import annotations

import json

import pytest

from builders.app.cli import main as cli_main
from helpers.eccv_fixtures import package_json, write_test_image_root
from helpers.training_helpers import final_metrics
from training.finetune_clip import main as train_main

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

#: Images given instance classes. The rest have none, so they are no PMRP query and no PM item:
#: with 4 classes over all 5,000 images each query would have ~1,250 plausible images, which
#: makes the suite minutes slower and tests nothing more.
WITH_CLASSES = 200


@pytest.fixture(scope="module")
def coco_5k(tmp_path_factory):
    base = tmp_path_factory.mktemp("coco5k")
    images = sorted(package_json("coco", "i2t"))
    assert len(images) == 5000
    root = write_test_image_root(
        base / "coco", {i: [1 + n % 4] if n < WITH_CLASSES else [] for n, i in enumerate(images)}
    )
    (root / "dataset_coco.json").write_text(
        json.dumps({"images": [{"cocoid": i, "filepath": "val2014", "split": "test"} for i in images]})
    )
    assert (
        cli_main(
            ["build", "coco-captions", "--coco-root", str(root), "--splits", "test", "--output", str(base / "cc")]
        )
        == 0
    )
    return root, base / "cc"


def test_coco_5k_report_adds_eccv_cxc_and_pmrp_equal_to_the_trainer(coco_5k, tiny_models_dir, tmp_path):
    from builders.models.profiles import tiny_profile
    from training.report.results import read_results

    root, cc = coco_5k
    clip = tiny_profile(tiny_models_dir).clip
    instances = str(root / "annotations" / "instances_val2014.json")
    assert (
        cli_main(
            [
                "benchmark",
                "--model",
                clip,
                "--coco",
                str(cc),
                "--coco-instances",
                instances,
                "--output",
                str(tmp_path / "report"),
            ]
        )
        == 0
    )
    records = read_results(tmp_path / "report" / "results.jsonl")
    eccv = next(r for r in records if r["task"] == "eccv")
    both = ("i2t", "t2i")
    assert set(eccv["metrics"]) == {
        f"{m}_{d}"
        for d in both
        for m in (
            "eccv_map_at_r",
            "eccv_rprecision",
            "eccv_r1",
            "pmrp",
            *(f"{s}_r{k}" for s in ("cxc", "coco_1k", "coco_5k") for k in (1, 5, 10)),
        )
    }
    assert all(0 < eccv["metrics"][f"pmrp_{d}"] < 1 for d in both)
    assert eccv["metric"] == "counterfactory_metrics.map_at_r"
    md = (tmp_path / "report" / "report.md").read_text()
    assert "eccv/eccv\\_map\\_at\\_r\\_i2t" in md and "eccv/pmrp\\_t2i" in md

    out = tmp_path / "trainer"
    assert (
        train_main(
            [
                "--real",
                str(cc),
                "--model",
                clip,
                "--eval-only",
                "--eccv",
                "--coco-instances",
                instances,
                "--num-workers",
                "0",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    trainer = final_metrics(out)
    compared = 0
    for r in records:
        for name, value in r["metrics"].items():
            # One vocabulary: the trainer names a record's metric `task/name` (#44).
            assert value == pytest.approx(trainer[f"{r['task']}/{name}"], abs=1e-6), (r["task"], name)
            compared += 1
    assert compared >= len(eccv["metrics"]) + 12  # and R@K 5K + 1K both ways
    # Two implementations of COCO 5K R@K (the trainer's folds, the ECCV suite's) agree.
    assert eccv["metrics"]["coco_5k_r5_i2t"] == pytest.approx(
        trainer["zeroshot_retrieval/text_retrieval_recall@5"], abs=1e-9
    )


def test_coco_instances_on_another_split_is_one_line(coco_5k, tiny_models_dir, tmp_path, capsys):
    from builders.models.profiles import tiny_profile

    root, _ = coco_5k
    assert (
        cli_main(
            [
                "build",
                "coco-captions",
                "--coco-root",
                str(root),
                "--splits",
                "test",
                "--max-images",
                "10",
                "--output",
                str(tmp_path / "cc10"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        cli_main(
            [
                "benchmark",
                "--model",
                tiny_profile(tiny_models_dir).clip,
                "--coco",
                str(tmp_path / "cc10"),
                "--coco-instances",
                str(root / "annotations" / "instances_val2014.json"),
                "--output",
                str(tmp_path / "report"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--coco" in err and "--coco-instances (PMRP) needs the COCO 5K test split" in err and "has 10" in err
