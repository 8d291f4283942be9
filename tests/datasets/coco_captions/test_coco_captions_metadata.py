"""`counterfactory build coco-captions --strip-metadata` (issue 41): COCO JPEGs are stored as
their files' bytes, so a photo's EXIF (its GPS position included) would be published with them.
The flag drops it without re-encoding: PIL (an independent reader) finds no EXIF, no GPS and no
comment in the stored image and decodes the source file's pixels; without it the bytes are the
file's. The card says which, and `counterfactory show` flags the images with a GPS position.
Issue 49: a GPS position hidden in any JPEG placement the prefix rule kept (JFIF or JFXX
thumbnail, ICC or Adobe segment, between scans, ...) leaves no EXIF, XMP or GPS byte behind."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

import pyarrow.parquet as pq
import pytest
from PIL import Image

from builders.app.cli import main as cli_main
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture

from helpers.gallery_helpers import page_records, show
from helpers.image_metadata_helpers import HIDDEN, add_gps, assert_stripped_of, hide_gps_in_jpegs, leaks

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


def build(coco: Path, out: Path, *extra: str) -> list[dict]:
    argv = ["build", "coco-captions", "--coco-root", str(coco), "--splits", "test", "--output", str(out)]
    assert cli_main([*argv, *extra]) == 0
    manifest = json.loads((out / "build_manifest.json").read_text())
    shards = [s for key, o in manifest["outputs"].items() if key.startswith("default/") for s in o["shards"]]
    return [r for s in shards for r in pq.read_table(out / s).to_pylist()]


def test_strip_metadata_of_coco_jpegs(tmp_path):
    coco = tmp_path / "coco"
    write_coco_fixture(coco, CocoFixtureConfig())
    by_bytes = add_gps(coco)

    kept = build(coco, tmp_path / "kept")
    assert kept and all(r["image"]["bytes"] in by_bytes for r in kept)  # the files, EXIF and all
    assert "Image metadata: kept." in (tmp_path / "kept" / "README.md").read_text()

    stripped = build(coco, tmp_path / "stripped", "--strip-metadata")
    assert len(stripped) == len(kept)
    for before, after in zip(kept, stripped, strict=True):
        assert_stripped_of(after["image"]["bytes"], before["image"]["bytes"])
    assert "Image metadata: stripped." in (tmp_path / "stripped" / "README.md").read_text()

    assert show(tmp_path / "kept", "--output", tmp_path / "gallery", "--config", "default") == 0
    records = page_records(tmp_path / "gallery")
    assert records and all(im.get("gps") for r in records for im in r["imgs"])


def test_strip_metadata_leaves_no_gps_byte_in_any_jpeg_placement(tmp_path):
    coco = tmp_path / "coco"
    write_coco_fixture(coco, CocoFixtureConfig())
    sources = hide_gps_in_jpegs(coco)

    rows = build(coco, tmp_path / "stripped", "--strip-metadata", "--splits", "train", "val", "test")
    assert {sources[r["file_name"]][0] for r in rows} == {n for n in HIDDEN if not n.startswith("png-")}
    for row in rows:
        source, stored = sources[row["file_name"]][1], row["image"]["bytes"]
        assert leaks(source) and leaks(stored) == [], row["file_name"]
        before, after = Image.open(io.BytesIO(source)), Image.open(io.BytesIO(stored))
        assert after.format == "JPEG" and np.array_equal(np.asarray(after), np.asarray(before))
    assert "Image metadata: stripped." in (tmp_path / "stripped" / "README.md").read_text()
