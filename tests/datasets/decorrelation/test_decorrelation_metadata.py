"""`build decorrelation --keep-original --strip-metadata` (issue 41): the source COCO JPEGs the
build stores byte for byte (`original_image`) lose their EXIF (GPS included) and comments without
re-encoding: PIL decodes the source file's pixels from the stored bytes and finds no metadata in
them; the card says the metadata was stripped. Issue 49: a GPS position hidden in any JPEG
placement the prefix rule kept leaves no EXIF, XMP or GPS byte in the kept originals."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from builders.app.cli import main as cli_main
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture

from helpers.image_metadata_helpers import HIDDEN, add_gps, assert_stripped_of, hide_gps_in_jpegs, leaks, stored

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


def test_decorrelation_strips_the_kept_originals(tmp_path, tiny_models_dir, nltk_data_dir):
    root = write_coco_fixture(tmp_path / "coco", CocoFixtureConfig(n_images=8))
    names = add_gps(root)
    out = tmp_path / "out"
    argv = ["build", "decorrelation", "--coco-root", str(root), "--output", str(out), "--models", "tiny"]
    argv += ["--tiny-models-dir", str(tiny_models_dir), "--fill", "zero", "--image-size", "64"]
    assert cli_main([*argv, "--keep-original", "--products", "odmap", "--strip-metadata"]) == 0
    originals = stored(out, "odmap_queries/test", "original_image")
    assert originals
    by_id = {int(name.rsplit("_", 1)[-1].split(".")[0]): data for data, name in names.items()}
    for image_id, data in originals.items():
        assert_stripped_of(data, by_id[image_id])
    assert "Image metadata: stripped." in (out / "README.md").read_text()


def test_decorrelation_strips_gps_from_every_jpeg_placement(tmp_path, tiny_models_dir, nltk_data_dir):
    root = write_coco_fixture(tmp_path / "coco", CocoFixtureConfig(n_images=14, test_fraction=1.0, val_fraction=0.0))
    sources = {
        int(name.rsplit("_", 1)[-1].split(".")[0]): way_data for name, way_data in hide_gps_in_jpegs(root).items()
    }
    out = tmp_path / "out"
    argv = ["build", "decorrelation", "--coco-root", str(root), "--output", str(out), "--models", "tiny"]
    argv += ["--tiny-models-dir", str(tiny_models_dir), "--fill", "zero", "--image-size", "64"]
    assert cli_main([*argv, "--keep-original", "--products", "odmap", "--strip-metadata"]) == 0
    originals = stored(out, "odmap_queries/test", "original_image")
    assert originals
    for image_id, data in originals.items():
        way, source = sources[image_id]
        assert leaks(source) and leaks(data) == [], way
        before, after = Image.open(io.BytesIO(source)), Image.open(io.BytesIO(data))
        assert after.format == "JPEG" and np.array_equal(np.asarray(after), np.asarray(before)), way
    assert {sources[i][0] for i in originals} == {n for n in HIDDEN if not n.startswith("png-")}
