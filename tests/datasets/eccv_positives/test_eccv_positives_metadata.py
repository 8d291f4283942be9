"""`build eccv-positives --strip-metadata` (issue 41): the query images (COCO JPEGs stored byte
for byte) lose their EXIF (GPS included) and comments without re-encoding: PIL decodes the source
file's pixels from the stored bytes and finds no metadata in them; the card says so."""

from __future__ import annotations

import pytest

from builders.app.cli import main as cli_main

from helpers.eccv_fixtures import package_json, write_test_image_root
from helpers.image_metadata_helpers import add_gps, assert_stripped_of, stored

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


def test_eccv_positives_strips_the_query_images(tmp_path):
    images = sorted(package_json("eccv", "i2t"))[:3]
    root = write_test_image_root(tmp_path / "coco", {i: [1] for i in images})
    sources = {f"COCO_val2014_{i:012d}.jpg": i for i in images}
    by_id = {sources[name]: data for data, name in add_gps(root).items() if name in sources}
    out = tmp_path / "out"
    argv = ["build", "eccv-positives", "--coco-root", str(root), "--output", str(out), "--strip-metadata"]
    assert cli_main(argv) == 0
    kept = stored(out, "i2t/test", "image")
    assert sorted(kept) == images
    for image_id, data in kept.items():
        assert_stripped_of(data, by_id[image_id])
    assert "Image metadata: stripped." in (out / "README.md").read_text()
