"""`counterfactory build coco-counterfactuals`: rows follow the raw COCO source (val2017 in
annotation-file order by default), caption pairs are one-word edits, the paper's image filters are
applied and counted, stages compose, a killed build resumes to identical shards, 2 processes equal
1, and the published dataset loads from the local Hub at its tag with the original release's
columns."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import load_dataset

from builders.counterfactuals.captions import CaptionModels, CaptionStage
from builders.counterfactuals.config import CaptionStageConfig
from builders.app.cli import main as cli_main
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture
from builders.models.profiles import resolve_profile

from helpers.build_helpers import accelerate_cmd, shard_digests

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

ORIGINAL_COLUMNS = ["id", "image_0", "image_1", "caption_0", "caption_1"]
PROVENANCE = [
    "source_id",
    "replaced_word",
    "replacement_word",
    "replaced_position",
    "similarity",
    "perplexity",
    "seed",
    "p",
    "guidance_scale",
    "clip_score_0",
    "clip_score_1",
    "clip_directional",
    "image_candidates_tried",
    "sd_model",
    "clip_model",
    "mlm_model",
]
BUILDER = Path(__file__).resolve().parents[3] / "builders" / "counterfactuals" / "builder.py"
#: Tiny image stage: few candidates, 2 steps at 64 px; the tiny profile's filter thresholds
#: (-1) let every candidate of the (random) CLIP pass.
IMAGE_ARGS = ["--image-size", "64", "--steps", "2", "--candidates", "3", "--candidate-batch", "2"]
FILTERS = ("text_image", "image_image", "directional")


def raw_val2017_captions(root: Path) -> list[tuple[str, int, str]]:
    """(id, caption id, text) of captions_val2017.json in file order; k of `<image id>_<k>`
    counts each image's captions in that order."""
    anns = json.loads((root / "annotations" / "captions_val2017.json").read_text())["annotations"]
    seen: dict[int, int] = {}
    out = []
    for a in anns:
        k = seen[a["image_id"]] = seen.get(a["image_id"], -1) + 1
        out.append((f"{a['image_id']}_{k}", a["id"], a["caption"].strip()))
    return out


def assert_one_word_edit(row: dict) -> None:
    """Cutting the swapped word out of both captions at `replaced_position` leaves equal strings."""
    c0, c1, start = row["caption_0"], row["caption_1"], row["replaced_position"]
    old, new = row["replaced_word"], row["replacement_word"]
    assert c0[start : start + len(old)] == old and c1[start : start + len(new)] == new, row["id"]
    assert c0[:start] + c0[start + len(old) :] == c1[:start] + c1[start + len(new) :], (c0, c1)
    assert old != new and "  " not in c1 and " ." not in c1, c1


@pytest.fixture(scope="module")
def coco2017_dir(tmp_path_factory) -> Path:
    """A val2017-layout source: the builder's default split, annotations in shuffled file order."""
    root = tmp_path_factory.mktemp("coco2017")
    return write_coco_fixture(root, CocoFixtureConfig(n_images=12, release="2017"))


def build(out: Path, coco: Path, tiny: Path, *extra: str, part_size: int = 4) -> None:
    argv = [
        "build",
        "coco-counterfactuals",
        "--coco-root",
        str(coco),
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny),
        "--output",
        str(out),
        "--part-size",
        str(part_size),
        *extra,
    ]
    assert cli_main(argv) == 0


@pytest.fixture(scope="module")
def captions_build(tmp_path_factory, coco2017_dir, tiny_models_dir, nltk_data_dir) -> Path:
    out = tmp_path_factory.mktemp("cf") / "captions"
    build(out, coco2017_dir, tiny_models_dir, "--stage", "captions")
    return out


def test_caption_stage_build_follows_the_source(captions_build, coco2017_dir, tiny_models_dir):
    raw = raw_val2017_captions(coco2017_dir)
    # The fixture's file order is not the sorted order: the test would not notice a re-sort.
    assert [c for _, c, _ in raw] != sorted(c for _, c, _ in raw)
    profile = resolve_profile("tiny", tiny_models_dir)
    stage = CaptionStage(CaptionModels.load(profile.mlm, profile.lm, profile.sentence), CaptionStageConfig())
    outcomes = stage.run([text for _, _, text in raw])
    rows = load_dataset(str(captions_build), split="test")  # the only config is the default
    by_id = {r["id"]: r for r in rows}
    assert len(by_id) == len(rows)
    produced = [row_id for row_id, _, _ in raw if row_id in by_id]
    assert rows["id"] == produced, "rows follow the annotation-file order"
    manifest = json.loads((captions_build / "build_manifest.json").read_text())
    expected_skips: dict[str, int] = {}
    for (row_id, caption_id, text), outcome in zip(raw, outcomes, strict=True):
        if isinstance(outcome, str):
            expected_skips[outcome] = expected_skips.get(outcome, 0) + 1
            assert row_id not in by_id
            continue
        row = by_id.pop(row_id)
        assert (row["caption_0"], row["caption_1"]) == (text, outcome.counterfactual)
        assert row["source_id"] == str(caption_id) and row["source_image_id"] == row_id.split("_")[0]
        assert row["replaced_word"] == outcome.replaced and row["replaced_position"] == outcome.start
        # The model as the manifest names it (a local folder by its contents, no local path).
        assert row["mlm_model"] == manifest["models"]["mlm"] and row["source"] == "coco/val2017"
        assert row["mlm_model"].startswith("local:mlm@sha256:") and profile.mlm not in row["mlm_model"]
        assert_one_word_edit(row)
    assert not by_id
    assert manifest["items"] == len(raw) and manifest["skipped"] == expected_skips
    assert len(rows) >= len(raw) // 2, "the paper's similarity window should keep most fixture captions"
    assert "Datasheet" in (captions_build / "README.md").read_text()


def test_help_shows_the_papers_filters_and_source(capsys):
    with pytest.raises(SystemExit) as done:
        cli_main(["build", "coco-counterfactuals", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--filters {text_image,image_image,directional}" in text
    assert "default: all three, as the paper" in text
    for flag, default in (
        ("--clip-threshold", "0.2"),
        ("--image-similarity-threshold", "0.7"),
        ("--directional-threshold", "0.2"),
    ):
        assert re.search(rf"{flag} [A-Z_]+ [^;]*; default {default} \(-1\.0 with --models tiny\)", text), flag
    assert "(default: val2017, as the paper)" in text


def test_any_text_dataset_with_counted_reasons(tmp_path, tiny_models_dir, nltk_data_dir):
    import datasets

    texts = [
        "Two dogs fighting over a frisbee.",
        "",
        "Dog",
        "一只狗在草地上奔跑。",
        " ".join(["a dog near the red table"] * 100),
        "A man riding a brown horse.",
    ]
    source = tmp_path / "source"
    source.mkdir()
    datasets.Dataset.from_dict({"text": texts, "key": [f"k{i}" for i in range(len(texts))]}).to_parquet(
        str(source / "train.parquet")
    )
    out = tmp_path / "out"
    assert (
        cli_main(
            [
                "build",
                "coco-counterfactuals",
                "--stage",
                "captions",
                "--dataset",
                str(source),
                "--text-column",
                "text",
                "--id-column",
                "key",
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--sim-low",
                "0",
                "--sim-high",
                "1",
                "--output",
                str(out),
                "--max-error-fraction",
                "0.5",
            ]
        )
        == 0
    )
    rows = load_dataset(str(out), split="test")
    assert rows["id"] == ["k0", "k5"] and rows["caption_0"] == [texts[0], texts[5]]
    manifest = json.loads((out / "build_manifest.json").read_text())
    assert manifest["errors"] == {"blank_caption": 1}
    assert manifest["skipped"] == {"not_english": 1, "too_long": 1, "too_short": 1}
    assert "| too_long | filtered by the method | 1 |" in (out / "README.md").read_text()


def test_full_build_equals_staged_build_resumes_and_publishes(
    captions_build, coco2017_dir, tiny_models_dir, tmp_path, local_hub
):
    full = tmp_path / "full"
    build(full, coco2017_dir, tiny_models_dir, "--max-captions", "8", *IMAGE_ARGS)
    pairs = load_dataset(str(full), split="test")
    assert pairs.column_names[:5] == ORIGINAL_COLUMNS and set(PROVENANCE) <= set(pairs.column_names)
    captions = load_dataset(str(full), "captions", split="test")
    # Every caption pair got an image pair (thresholds -1): same rows in both configs.
    assert pairs["id"] == captions["id"] and pairs["caption_1"] == captions["caption_1"]
    for row in pairs:
        assert row["image_0"].size == (64, 64) and row["image_1"].mode == "RGB"
        assert not np.array_equal(np.asarray(row["image_0"]), np.asarray(row["image_1"]))
        assert 0.1 <= row["p"] <= 0.9 and 7.5 <= row["guidance_scale"] <= 15
        assert row["image_candidates_tried"] == row["image_candidates_passed"] == 3
        assert [row[f"image_rejected_{f}"] for f in FILTERS] == [0, 0, 0]
        assert_one_word_edit(row)
    manifest = json.loads((full / "build_manifest.json").read_text())
    assert manifest["config"]["images"]["filters"] == list(FILTERS)
    assert manifest["counts"] == {
        "image_candidates_passed": 3 * len(pairs),
        "image_candidates_tried": 3 * len(pairs),
        **{f"image_rejected_{f}": 0 for f in FILTERS},
    }
    card_rows = {
        line.split("|")[1].strip(): line
        for line in (full / "README.md").read_text().splitlines()
        if line.startswith("| `")
    }
    for name in FILTERS:  # filter, rule, threshold (the tiny profile's), applied, rejections
        assert card_rows[f"`{name}`"].endswith("| -1.0 | yes | 0 |"), card_rows

    # The paper's image-image filter with a threshold no pair of different images reaches
    # rejects every candidate; each rejection is counted per filter, and the caption pairs are
    # skipped with a reason. With `--filters text_image` the same threshold is not applied.
    strict = tmp_path / "strict"
    build(
        strict,
        coco2017_dir,
        tiny_models_dir,
        "--stage",
        "images",
        "--captions-from",
        str(captions_build),
        "--max-captions",
        "2",
        *IMAGE_ARGS,
        "--image-similarity-threshold",
        "1.01",
    )
    manifest = json.loads((strict / "build_manifest.json").read_text())
    assert manifest["skipped"] == {"no_image_candidate_passed_clip": 2}
    assert manifest["counts"]["image_rejected_image_image"] == manifest["counts"]["image_candidates_tried"] == 6
    assert manifest["counts"]["image_rejected_text_image"] == 0
    assert (
        "| `image_image` | CLIP cos(image_0, image_1) ≥ threshold | 1.01 | yes | 6 |"
        in (strict / "README.md").read_text()
    )
    loose = tmp_path / "loose"
    build(
        loose,
        coco2017_dir,
        tiny_models_dir,
        "--stage",
        "images",
        "--captions-from",
        str(captions_build),
        "--max-captions",
        "2",
        *IMAGE_ARGS,
        "--image-similarity-threshold",
        "1.01",
        "--filters",
        "text_image",
    )
    manifest = json.loads((loose / "build_manifest.json").read_text())
    assert manifest["skipped"] == {} and manifest["counts"]["image_candidates_passed"] == 6
    assert set(manifest["counts"]) == {
        "image_candidates_passed",
        "image_candidates_tried",
        "image_rejected_text_image",
    }
    assert all(r["image_rejected_image_image"] is None for r in load_dataset(str(loose), split="test"))

    # The images stage on an earlier captions build gives the same image pairs.
    staged = tmp_path / "staged"
    build(
        staged,
        coco2017_dir,
        tiny_models_dir,
        "--stage",
        "images",
        "--captions-from",
        str(captions_build),
        "--max-captions",
        str(len(pairs)),
        *IMAGE_ARGS,
    )
    staged_pairs = load_dataset(str(staged), split="test")
    assert staged_pairs["id"] == pairs["id"] and staged_pairs["seed"] == pairs["seed"]
    assert all(
        np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(staged_pairs["image_1"], pairs["image_1"], strict=True)
    )

    # A crash after part 0: its stats are gone and a part file is truncated; the resume redoes
    # only that part and ends with identical shards.
    reference = shard_digests(full)
    (full / ".parts/stats/part-00000.json").unlink()
    part = full / ".parts/default/test/part-00000.parquet"
    part.write_bytes(part.read_bytes()[:100])
    mtime_part1 = (full / ".parts/stats/part-00001.json").stat().st_mtime_ns
    build(full, coco2017_dir, tiny_models_dir, "--max-captions", "8", *IMAGE_ARGS)
    assert shard_digests(full) == reference
    assert (full / ".parts/stats/part-00001.json").stat().st_mtime_ns == mtime_part1

    repo = "tester/coco-counterfactuals"
    assert cli_main(["publish", str(full), "--repo-id", repo, "--version", "v1.0.0"]) == 0
    remote = load_dataset(repo, split="test", revision="v1.0.0")
    # Order-insensitive: the manifest is written with sorted keys, and the published card's
    # feature list (hence the remote column order) follows it.
    assert set(ORIGINAL_COLUMNS + PROVENANCE) <= set(remote.column_names)
    assert (
        remote.remove_columns(["image_0", "image_1"]).to_list()
        == pairs.remove_columns(["image_0", "image_1"]).to_list()
    )
    assert all(
        np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(remote["image_0"], pairs["image_0"], strict=True)
    )


@pytest.mark.accelerate
@pytest.mark.parametrize("variant", ["karpathy", "val2017-grouped"])
def test_two_processes_equal_one(variant, coco_fixture_dir, coco2017_dir, tiny_models_dir, nltk_data_dir, tmp_path):
    # CPU float sums depend on the intra-op thread count: every run uses one thread per process.
    # `karpathy`: the Karpathy-split source, as the demo reads it, independent candidates;
    # `val2017-grouped`: the default source (file order) and the grouped plan's shared UNet work.
    coco, extra = {
        "karpathy": (coco_fixture_dir, ["--karpathy-splits", "test"]),
        "val2017-grouped": (coco2017_dir, ["--candidate-plan", "grouped", "--seeds", "2", "--p-values", "3"]),
    }[variant]
    image_args = (
        IMAGE_ARGS if variant == "karpathy" else ["--image-size", "64", "--steps", "2", "--candidate-batch", "4"]
    )
    common = ["--max-captions", "8", "--torch-threads", "1", *extra, *image_args]
    args = [
        "--coco-root",
        str(coco),
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--part-size",
        "2",
        *common,
    ]
    single = tmp_path / "single"
    threads = torch.get_num_threads()
    try:
        build(single, coco, tiny_models_dir, *common, part_size=2)
    finally:
        torch.set_num_threads(threads)
    multi = tmp_path / "multi"
    cmd = accelerate_cmd(BUILDER, *args, "--output", str(multi), "--expect-processes", "2")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = {json.loads(p.read_text())["rank"] for p in (multi / ".parts/stats").glob("*.json")}
    assert ranks == {0, 1}
    assert shard_digests(multi) == shard_digests(single)
