"""`counterfactory build coco-counterfactuals`: rows follow the raw COCO source, stages compose,
a killed build resumes to identical shards, 2 processes equal 1, and the published dataset loads
from the local Hub at its tag with the original release's columns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import load_dataset

from builders.infra.cli import main as cli_main
from builders.counterfactuals.captions import CaptionModels, CaptionStage, CaptionStageConfig
from builders.infra.models.profiles import resolve_profile

sys.path.insert(0, str(Path(__file__).parent))
from build_helpers import accelerate_cmd, shard_digests  # noqa: E402

ORIGINAL_COLUMNS = ["id", "image_0", "image_1", "caption_0", "caption_1"]
PROVENANCE = ["source_id", "replaced_word", "replacement_word", "replaced_position", "similarity",
              "perplexity", "seed", "p", "guidance_scale", "clip_score_0", "clip_score_1",
              "clip_directional", "image_candidates_tried", "sd_model", "clip_model", "mlm_model"]
BUILDER = Path(__file__).resolve().parents[1] / "builders" / "counterfactuals" / "builder.py"
#: Tiny image stage: few candidates, 2 steps at 64 px, every candidate passes the (random) CLIP.
IMAGE_ARGS = ["--image-size", "64", "--steps", "2", "--candidates", "3", "--candidate-batch", "2",
              "--clip-threshold", "-1"]


def raw_test_captions(root: Path) -> list[tuple[str, int, str]]:
    """(id, caption id, text) of the Karpathy test captions, straight from the JSON files, in
    image-id then annotation-id order."""
    test_ids = {e["cocoid"] for e in json.loads((root / "dataset_coco.json").read_text())["images"]
                if e["split"] == "test"}
    anns = [a for f in sorted((root / "annotations").glob("captions_*.json"))
            for a in json.loads(f.read_text())["annotations"] if a["image_id"] in test_ids]
    out = []
    for image_id in sorted(test_ids):
        mine = sorted((a for a in anns if a["image_id"] == image_id), key=lambda a: a["id"])
        out += [(f"{image_id}_{k}", a["id"], a["caption"].strip()) for k, a in enumerate(mine)]
    return out


def build(out: Path, coco: Path, tiny: Path, *extra: str, part_size: int = 4) -> None:
    argv = ["build", "coco-counterfactuals", "--coco-root", str(coco), "--models", "tiny",
            "--tiny-models-dir", str(tiny), "--output", str(out), "--part-size", str(part_size),
            *extra]
    assert cli_main(argv) == 0


@pytest.fixture(scope="module")
def captions_build(tmp_path_factory, coco_fixture_dir, tiny_models_dir, nltk_data_dir) -> Path:
    out = tmp_path_factory.mktemp("cf") / "captions"
    build(out, coco_fixture_dir, tiny_models_dir, "--stage", "captions")
    return out


def test_caption_stage_build_follows_the_source(captions_build, coco_fixture_dir, tiny_models_dir):
    raw = raw_test_captions(coco_fixture_dir)
    profile = resolve_profile("tiny", tiny_models_dir)
    stage = CaptionStage(CaptionModels.load(profile.mlm, profile.lm, profile.sentence),
                         CaptionStageConfig())
    outcomes = stage.run([text for _, _, text in raw])
    rows = load_dataset(str(captions_build), split="test")  # the only config is the default
    by_id = {r["id"]: r for r in rows}
    assert len(by_id) == len(rows)
    manifest = json.loads((captions_build / "build_manifest.json").read_text())
    expected_skips: dict[str, int] = {}
    for (row_id, caption_id, text), outcome in zip(raw, outcomes):
        if isinstance(outcome, str):
            expected_skips[outcome] = expected_skips.get(outcome, 0) + 1
            assert row_id not in by_id
            continue
        row = by_id.pop(row_id)
        assert (row["caption_0"], row["caption_1"]) == (text, outcome.counterfactual)
        assert row["source_id"] == str(caption_id) and row["source_image_id"] == row_id.split("_")[0]
        assert row["replaced_word"] == outcome.replaced and row["replaced_position"] == outcome.position
        assert row["mlm_model"] == profile.mlm
    assert not by_id
    assert manifest["items"] == len(raw) and manifest["skipped"] == expected_skips
    assert len(rows) >= len(raw) // 2, "the paper's similarity window should keep most fixture captions"
    assert "Datasheet" in (captions_build / "README.md").read_text()


def test_any_text_dataset_with_counted_reasons(tmp_path, tiny_models_dir, nltk_data_dir):
    import datasets

    texts = ["Two dogs fighting over a frisbee.", "", "Dog", "一只狗在草地上奔跑。",
             " ".join(["a dog near the red table"] * 100), "A man riding a brown horse."]
    source = tmp_path / "source"
    source.mkdir()
    datasets.Dataset.from_dict({"text": texts, "key": [f"k{i}" for i in range(len(texts))]}) \
        .to_parquet(str(source / "train.parquet"))
    out = tmp_path / "out"
    assert cli_main(["build", "coco-counterfactuals", "--stage", "captions", "--dataset",
                     str(source), "--text-column", "text", "--id-column", "key", "--models", "tiny",
                     "--tiny-models-dir", str(tiny_models_dir), "--sim-low", "0", "--sim-high", "1",
                     "--output", str(out), "--max-error-fraction", "0.5"]) == 0
    rows = load_dataset(str(out), split="test")
    assert rows["id"] == ["k0", "k5"] and rows["caption_0"] == [texts[0], texts[5]]
    manifest = json.loads((out / "build_manifest.json").read_text())
    assert manifest["errors"] == {"empty_caption": 1}
    assert manifest["skipped"] == {"not_english": 1, "too_long": 1, "too_short": 1}
    assert "| too_long | filtered by the method | 1 |" in (out / "README.md").read_text()


def test_full_build_equals_staged_build_resumes_and_publishes(
        captions_build, coco_fixture_dir, tiny_models_dir, tmp_path, local_hub):
    full = tmp_path / "full"
    build(full, coco_fixture_dir, tiny_models_dir, "--max-captions", "8", *IMAGE_ARGS)
    pairs = load_dataset(str(full), split="test")
    assert pairs.column_names[:5] == ORIGINAL_COLUMNS and set(PROVENANCE) <= set(pairs.column_names)
    captions = load_dataset(str(full), "captions", split="test")
    # Every caption pair got an image pair (CLIP threshold -1): same rows in both configs.
    assert pairs["id"] == captions["id"] and pairs["caption_1"] == captions["caption_1"]
    for row in pairs:
        assert row["image_0"].size == (64, 64) and row["image_1"].mode == "RGB"
        assert not np.array_equal(np.asarray(row["image_0"]), np.asarray(row["image_1"]))
        assert 0.1 <= row["p"] <= 0.9 and 7.5 <= row["guidance_scale"] <= 15
        assert row["image_candidates_tried"] == 3

    # The images stage on an earlier captions build gives the same image pairs.
    staged = tmp_path / "staged"
    build(staged, coco_fixture_dir, tiny_models_dir, "--stage", "images", "--captions-from",
          str(captions_build), "--max-captions", str(len(pairs)), *IMAGE_ARGS)
    staged_pairs = load_dataset(str(staged), split="test")
    assert staged_pairs["id"] == pairs["id"] and staged_pairs["seed"] == pairs["seed"]
    assert all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(staged_pairs["image_1"], pairs["image_1"]))

    # A crash after part 0: its stats are gone and a part file is truncated; the resume redoes
    # only that part and ends with identical shards.
    reference = shard_digests(full)
    (full / ".parts/stats/part-00000.json").unlink()
    part = full / ".parts/default/test/part-00000.parquet"
    part.write_bytes(part.read_bytes()[:100])
    mtime_part1 = (full / ".parts/stats/part-00001.json").stat().st_mtime_ns
    build(full, coco_fixture_dir, tiny_models_dir, "--max-captions", "8", *IMAGE_ARGS)
    assert shard_digests(full) == reference
    assert (full / ".parts/stats/part-00001.json").stat().st_mtime_ns == mtime_part1

    repo = "tester/coco-counterfactuals"
    assert cli_main(["publish", str(full), "--repo-id", repo, "--version", "v1.0.0"]) == 0
    remote = load_dataset(repo, split="test", revision="v1.0.0")
    # Order-insensitive: the manifest is written with sorted keys, and the published card's
    # feature list (hence the remote column order) follows it.
    assert set(ORIGINAL_COLUMNS + PROVENANCE) <= set(remote.column_names)
    assert remote.remove_columns(["image_0", "image_1"]).to_list() == \
        pairs.remove_columns(["image_0", "image_1"]).to_list()
    assert all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(remote["image_0"], pairs["image_0"]))


@pytest.mark.accelerate
def test_two_processes_equal_one(coco_fixture_dir, tiny_models_dir, nltk_data_dir, tmp_path):
    # CPU float sums depend on the intra-op thread count: every run uses one thread per process.
    common = ["--max-captions", "8", "--torch-threads", "1", *IMAGE_ARGS]
    args = ["--coco-root", str(coco_fixture_dir), "--models", "tiny", "--tiny-models-dir",
            str(tiny_models_dir), "--part-size", "2", *common]
    single = tmp_path / "single"
    threads = torch.get_num_threads()
    try:
        build(single, coco_fixture_dir, tiny_models_dir, *common, part_size=2)
    finally:
        torch.set_num_threads(threads)
    multi = tmp_path / "multi"
    cmd = accelerate_cmd(BUILDER, *args, "--output", str(multi), "--expect-processes", "2")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = {json.loads(p.read_text())["rank"] for p in (multi / ".parts/stats").glob("*.json")}
    assert ranks == {0, 1}
    assert shard_digests(multi) == shard_digests(single)
