"""`counterfactory build coco-captions`: rows match the raw COCO source, bad images are skipped
with a recorded reason, and the build publishes and reloads from the local Hub by tag."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from datasets import load_dataset
from PIL import Image

from builders.app.cli import main as cli_main
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


def raw_source(root: Path, split: str) -> dict[int, dict]:
    """Image id -> {file, captions} for a Karpathy split, straight from the JSON files."""
    karpathy = json.loads((root / "dataset_coco.json").read_text())["images"]
    out = {
        e["cocoid"]: {"file": root / e["filepath"] / e["filename"], "captions": set()}
        for e in karpathy
        if e["split"] == split
    }
    for ann_file in (root / "annotations").glob("captions_*.json"):
        for ann in json.loads(ann_file.read_text())["annotations"]:
            if ann["image_id"] in out:
                out[ann["image_id"]]["captions"].add(ann["caption"])
    return out


def test_build_matches_source_and_publishes(coco_fixture_dir, tmp_path, local_hub):
    out = tmp_path / "build"
    assert (
        cli_main(
            [
                "build",
                "coco-captions",
                "--coco-root",
                str(coco_fixture_dir),
                "--splits",
                "test",
                "val",
                "--output",
                str(out),
                "--part-size",
                "3",
            ]
        )
        == 0
    )
    for split in ("test", "val"):
        expected = raw_source(coco_fixture_dir, split)
        rows = load_dataset(str(out), split=split)
        assert sorted(rows["image_id"]) == sorted(expected)
        for row in rows:
            src = expected[row["image_id"]]
            assert set(row["captions"]) == src["captions"]
            assert np.array_equal(np.asarray(row["image"]), np.asarray(Image.open(src["file"]).convert("RGB")))
        caps = load_dataset(str(out), "captions", split=split)
        assert len(caps) == sum(len(s["captions"]) for s in expected.values())

    repo = "tester/coco-karpathy"
    assert cli_main(["publish", str(out), "--repo-id", repo, "--version", "v1.0.0"]) == 0
    remote = load_dataset(repo, split="test", revision="v1.0.0")
    local = load_dataset(str(out), split="test")
    assert remote["image_id"] == local["image_id"]
    assert all(
        np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(remote["image"], local["image"], strict=True)
    )


def test_unreadable_image_is_skipped_with_reason_and_the_rest_is_kept(tmp_path):
    root = write_coco_fixture(tmp_path / "coco", CocoFixtureConfig(n_images=20))
    expected = raw_source(root, "test")
    broken_id = sorted(expected)[1]
    expected[broken_id]["file"].write_bytes(b"not a jpeg")
    out = tmp_path / "build"
    # One bad image among five is above the default 5% error budget: the run must fail loudly ...
    assert (
        cli_main(["build", "coco-captions", "--coco-root", str(root), "--output", str(out), "--part-size", "2"]) == 2
    )
    stats = [json.loads(p.read_text()) for p in out.rglob("stats/part-*.json")]
    assert sum(s["errors"].get("unreadable_image", 0) for s in stats) == 1
    # ... and a resume with a looser budget reuses the finished parts and completes.
    assert (
        cli_main(
            [
                "build",
                "coco-captions",
                "--coco-root",
                str(root),
                "--output",
                str(out),
                "--part-size",
                "2",
                "--max-error-fraction",
                "0.5",
            ]
        )
        == 0
    )
    rows = load_dataset(str(out), split="test")
    assert sorted(rows["image_id"]) == sorted(set(expected) - {broken_id})


def test_each_annotation_file_is_parsed_once_per_run(coco_fixture_dir, tmp_path, monkeypatch):
    """Issue 25: the Karpathy splits share COCO folders (test and val both live in val2014), so a
    read per split parsed captions_val2014.json and instances_val2014.json once per split."""
    import loading_scripts.coco as coco

    loads: Counter = Counter()
    real_load = coco.load_json

    def counting_load(path, what):
        loads[Path(path).name] += 1
        return real_load(path, what)

    monkeypatch.setattr(coco, "load_json", counting_load)
    out = tmp_path / "build"
    assert (
        cli_main(
            [
                "build",
                "coco-captions",
                "--coco-root",
                str(coco_fixture_dir),
                "--splits",
                "test",
                "val",
                "--max-images",
                "2",
                "--output",
                str(out),
                "--part-size",
                "3",
            ]
        )
        == 0
    )
    assert loads and set(loads.values()) == {1}, loads
    assert {"captions_val2014.json", "instances_val2014.json", "dataset_coco.json"} <= set(loads)
    # --max-images is still per split: the first 2 images (by id) of each, from the raw JSON.
    for split in ("test", "val"):
        rows = load_dataset(str(out), split=split)
        assert sorted(rows["image_id"]) == sorted(raw_source(coco_fixture_dir, split))[:2]
    stats = [json.loads(p.read_text()) for p in out.rglob("stats/part-*.json")]
    assert stats and all(s["peak_rss_bytes"] > 0 for s in stats), stats
