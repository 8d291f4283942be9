"""`counterfactory build decorrelation --verify-removal`: removed objects really are gone.

Two scorers stand behind the check. An oracle that knows how the fixture paints each class (its
red and green; `builders/devtools/fixtures/coco.py`) tells whether an object is still in the view,
so a fill that leaves the object (identity, substituted in this test) must lose every candidate to
`object_still_visible` and a fill that removes it (`zero`) none. The tiny CLIP's scores are
compared with a zero-shot classification computed here with transformers directly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import load_dataset
from PIL import Image

from builders.decorrelation import options, verify
from builders.decorrelation.fill import ImageFiller
from builders.app.cli import main as cli_main
from builders.devtools.fixtures.coco import CocoFixtureConfig, class_red_green, write_coco_fixture
from builders.models.profiles import PRODUCTION, resolve_profile

from helpers.decorrelation_fixtures import build_args, raw_images
from helpers.selection_reference import brute_force

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

#: The oracle calls a class visible in a view when this fraction of its pixels has the class's colour.
TOL = 16
ORACLE_THRESHOLD = 0.03
TRAIN_ONLY = ["--products", "train", "--caption", "prompts"]


class ColourOracle:
    """p(c | view) = fraction of the view's pixels whose red and green are the fixture's for c."""

    def __init__(self, class_names):
        self.rg = np.array([class_red_green(c) for c in class_names])[None, None]

    def probabilities(self, images):
        out = []
        for im in images:
            rg = np.asarray(im.convert("RGB"), dtype=np.int16)[..., None, :2]  # H x W x 1 x 2
            close = (np.abs(rg - self.rg) <= TOL).all(-1)  # H x W x classes (JPEG noise tolerated)
            out.append(close.mean((0, 1)))
        return np.stack(out)


@pytest.fixture
def oracle(monkeypatch):
    """Substitutes the scorer; returns the list of scorers made (one per build process)."""
    made = []
    monkeypatch.setattr(
        verify,
        "load_scorer",
        lambda config, class_names, precision=None: made.append(ColourOracle(class_names)) or made[-1],
    )
    return made


def _expected_train_removals(root: Path) -> set[tuple[int, str]]:
    return {
        (image_id, anchor)
        for image_id, im in raw_images(root).items()
        if im["split"] in ("train", "restval")
        for anchor, *_ in brute_force(im["boxes"], im["w"], im["h"])[0]
    }


def test_identity_fill_is_caught_and_zero_fill_passes(
    coco_fixture_dir, tiny_models_dir, tmp_path, oracle, monkeypatch
):
    want = _expected_train_removals(coco_fixture_dir)
    check = ["--verify-removal", "--verify-threshold", str(ORACLE_THRESHOLD)]

    removed = tmp_path / "zero"
    assert (
        cli_main(
            [
                "build",
                "decorrelation",
                *build_args(coco_fixture_dir, removed, tiny_models_dir),
                *TRAIN_ONLY,
                "--fill",
                "zero",
                *check,
            ]
        )
        == 0
    )
    rows = load_dataset(str(removed), split="train")
    assert {(r["image_id"], r["anchor_class"]) for r in rows} == want
    assert "object_still_visible" not in json.loads((removed / "build_manifest.json").read_text())["skipped"]
    for row in rows:
        assert len(row["visibility_after"]) == len(row["removed_classes"])
        assert max(row["visibility_after"]) < ORACLE_THRESHOLD
    assert len(oracle) == 1  # loaded once for the whole build, not per part or row
    # The check saw the objects before the fill (it can tell), in all but tiny or occluded cases.
    seen = [max(r["visibility_before"]) >= ORACLE_THRESHOLD for r in rows]
    assert sum(seen) >= 0.9 * len(seen)

    kept = tmp_path / "identity"
    monkeypatch.setattr(ImageFiller, "fill", lambda self, image, mask, seed: image.copy())
    assert (
        cli_main(
            [
                "build",
                "decorrelation",
                *build_args(coco_fixture_dir, kept, tiny_models_dir),
                *TRAIN_ONLY,
                "--fill",
                "zero",
                *check,
            ]
        )
        == 0
    )
    manifest = json.loads((kept / "build_manifest.json").read_text())
    left = {(r["image_id"], r["anchor_class"]) for r in load_dataset(str(kept), split="train")}
    # Every removal whose object the oracle saw before is now caught; the rest are kept.
    assert manifest["skipped"]["object_still_visible"] == sum(seen)
    assert len(left) == len(want) - sum(seen)
    card = (kept / "README.md").read_text()
    assert f"| object_still_visible | filtered by the method | {sum(seen)} |" in card
    assert f">= {ORACLE_THRESHOLD} on x'" in card


def _zero_shot(model, processor, images, prompts):
    """Softmax over prompts of CLIP's scaled cosine similarities, straight from transformers."""
    with torch.no_grad():
        img = model.get_image_features(**processor(images=images, return_tensors="pt"))
        txt = model.get_text_features(**processor(text=prompts, return_tensors="pt", padding=True))
        img = getattr(img, "pooler_output", img)
        txt = getattr(txt, "pooler_output", txt)
        img, txt = img / img.norm(dim=-1, keepdim=True), txt / txt.norm(dim=-1, keepdim=True)
        return (model.logit_scale.exp() * img @ txt.T).softmax(-1).numpy()


def test_clip_scores_equal_an_independent_zero_shot_and_the_threshold_applies(tiny_models_dir, tmp_path):
    from builders.models.loaders import load_clip

    root = tmp_path / "square"  # square images: the whole-image view needs no padding
    write_coco_fixture(root, CocoFixtureConfig(n_images=12, image_size=(96, 96)))
    raw = raw_images(root)

    def build(out: Path, threshold: float) -> None:
        assert (
            cli_main(
                [
                    "build",
                    "decorrelation",
                    *build_args(root, out, tiny_models_dir),
                    *TRAIN_ONLY,
                    "--fill",
                    "blur",
                    "--verify-removal",
                    "--verify-view",
                    "image",
                    "--verify-threshold",
                    repr(threshold),
                ]
            )
            == 0
        )

    out = tmp_path / "all"
    build(out, 1.0)  # a softmax never reaches 1: every row is kept, with its scores
    rows = load_dataset(str(out), split="train")
    assert len(rows) >= 4

    clip_path = resolve_profile("tiny", tiny_models_dir).clip
    manifest = json.loads((out / "build_manifest.json").read_text())
    assert "clip_filter" in manifest["models"]  # the tiny profile's CLIP serves both CLIP roles
    model, processor = load_clip(clip_path)
    classes = manifest["config"]["class_names"]
    prompts = [f"a photo of a {c}." for c in classes]
    for row in rows:
        source = Image.open(raw[row["image_id"]]["file"]).convert("RGB")
        probs = _zero_shot(model, processor, [source, row["image"]], prompts)
        columns = [classes.index(c) for c in row["removed_classes"]]
        assert row["visibility_before"] == pytest.approx(probs[0, columns].tolist(), abs=1e-5)
        assert row["visibility_after"] == pytest.approx(probs[1, columns].tolist(), abs=1e-5)

    # A threshold between the scores: exactly the rows with a removed class at or above it go.
    after = sorted(max(r["visibility_after"]) for r in rows)
    threshold = (after[len(after) // 2 - 1] + after[len(after) // 2]) / 2
    strict = tmp_path / "strict"
    build(strict, threshold)
    kept = {r["row_id"] for r in load_dataset(str(strict), split="train")}
    assert kept == {r["row_id"] for r in rows if max(r["visibility_after"]) < threshold}
    skipped = json.loads((strict / "build_manifest.json").read_text())["skipped"]
    assert skipped["object_still_visible"] == len(rows) - len(kept) > 0


def _parse(*flags):
    import argparse

    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    return options.config_from_args(parser.parse_args(["--coco-root", "coco", *flags]))


def test_check_is_on_for_production_inpainting_only(tiny_models_dir):
    production = _parse("--fill", "inpaint").verify
    assert production.enabled and production.model == PRODUCTION.clip_filter
    assert not _parse("--fill", "zero").verify.enabled
    assert not _parse("--fill", "inpaint", "--no-verify-removal").verify.enabled
    tiny = ["--models", "tiny", "--tiny-models-dir", str(tiny_models_dir)]
    assert not _parse(*tiny).verify.enabled  # random-init CLIP: off unless asked for
    assert _parse(*tiny, "--fill", "zero", "--verify-removal").verify.enabled
    assert _parse("--clip-filter-model", "my/clip").verify.model == "my/clip"


def test_region_view_is_a_square_around_the_filled_region():
    mask = np.zeros((40, 60), bool)
    mask[10:20, 30:34] = True  # 10 rows x 4 columns
    assert verify.view_box(mask, 0.25) == (24, 7, 39, 22)  # side ceil(10 * 1.5) = 15, centred
    mask[:] = False
    mask[0:4, 56:60] = True  # at the corner: shifted inside the image
    assert verify.view_box(mask, 0.5) == (52, 0, 60, 8)
    assert verify.view_box(np.ones((40, 60), bool), 0.25) == (0, 0, 60, 40)  # clipped to the image
    padded = verify.square(Image.new("RGB", (8, 2), (255, 0, 0)))
    assert padded.size == (8, 8) and padded.getpixel((0, 3)) == (255, 0, 0)
