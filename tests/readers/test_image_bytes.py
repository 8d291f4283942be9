"""Real images keep their bytes (issue #34 §5).

A build stores a source image's file as read when it decodes as it is to its checked 8-bit RGB
pixels (a single-frame 8-bit RGB JPEG or PNG, no transparency, no EXIF rotation, no trailing data
past the bound); every other image is stored converted, as PNG, with the pixels of the README's
mode rule. Builds used to re-encode every COCO JPEG as PNG (about 3x the bytes, and
the trainer's `--fast-decode`, JPEG only, never applied). Expected bytes are the files the test
wrote; expected pixels are computed here with numpy from what the test wrote, and read back the
ways users read a build: pyarrow on the shards, and `datasets.load_dataset` (which turns an image
by its EXIF orientation).
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path
from typing import Any, Callable

import datasets
import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from builders.app.cli import main as cli_main
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture
from builders.engine.sharding.layout import OutputLayout
from builders.engine.sharding.up_to_date import invalidate

from helpers.build_helpers import error_line
from helpers.eccv_fixtures import package_json, write_test_image_root

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

W, H = 128, 96  # the COCO fixture's image size
RNG = np.random.default_rng(34)


def manifest_of(out: Path) -> dict[str, Any]:
    return json.loads((out / "build_manifest.json").read_text())


def cells(out: Path, key: str, column: str = "image") -> dict[int, dict]:
    """image id -> the stored cell of `column`, read with pyarrow from the manifest's shards."""
    found = {}
    for shard in manifest_of(out)["outputs"][key]["shards"]:
        table = pq.read_table(out / shard)
        # The published schema is unchanged: a datasets Image() column of {bytes, path} cells.
        features = datasets.Features.from_arrow_schema(table.schema)
        assert features[column] == datasets.Image(), features[column]
        for row in table.to_pylist():
            found[row["image_id"]] = row[column]
    return found


def source_files(root: Path) -> dict[int, Path]:
    """image id -> its file, from the Karpathy split file (not the project's reader)."""
    return {
        e["cocoid"]: root / e["filepath"] / e["filename"]
        for e in json.loads((root / "dataset_coco.json").read_text())["images"]
    }


def decoded(cell: dict) -> Image.Image:
    return Image.open(io.BytesIO(cell["bytes"]))


def captions_build(root: Path, out: Path, *more: str) -> int:
    return cli_main(
        [
            "build",
            "coco-captions",
            "--coco-root",
            str(root),
            "--splits",
            "train",
            "restval",
            "val",
            "test",
            "--output",
            str(out),
            "--part-size",
            "4",
            *more,
        ]
    )


# ------------------------------------------------------------------------------ JPEGs as read


def test_coco_captions_stores_each_jpeg_byte_for_byte(coco_fixture_dir, tmp_path):
    out = tmp_path / "build"
    assert captions_build(coco_fixture_dir, out) == 0
    files = source_files(coco_fixture_dir)
    stored = {}
    for split in ("train", "restval", "val", "test"):
        stored.update(cells(out, f"default/{split}"))
    assert len(stored) == len(files)
    for image_id, cell in stored.items():
        assert cell == {"bytes": files[image_id].read_bytes(), "path": None}, image_id
    # The rule is recorded with the build's config (and so in the resume fingerprint).
    assert manifest_of(out)["config"]["image_encoding"]
    rows = datasets.load_dataset(str(out), split="test")
    for row in rows:
        assert np.array_equal(np.asarray(row["image"]), np.asarray(Image.open(files[row["image_id"]])))


def test_a_build_started_before_the_change_is_refused_then_rebuilt(coco_fixture_dir, tmp_path, capsys):
    """A part stored as PNG by an older build must never be merged with parts stored as read: the
    recorded config differs, so a resume is refused in one line; `--overwrite` rebuilds it all."""
    out = tmp_path / "build"
    assert captions_build(coco_fixture_dir, out) == 0
    # What an older build leaves: its run.json (config without the encoding), a part unfinished.
    run_file = out / ".parts/run.json"
    run = json.loads(run_file.read_text())
    del run["config"]["image_encoding"]
    run_file.write_text(json.dumps(run))
    invalidate(OutputLayout(out))  # as a run removes the manifest before building a part
    last = sorted((out / ".parts/stats").glob("part-*.json"))[-1]
    last.unlink()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert captions_build(coco_fixture_dir, out) == 2
    line = error_line(capsys)
    assert "different configuration" in line and str(run_file) in line and "--overwrite" in line
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert captions_build(coco_fixture_dir, out, "--overwrite") == 0
    files = source_files(coco_fixture_dir)
    for image_id, cell in cells(out, "default/test").items():
        assert cell["bytes"] == files[image_id].read_bytes()


# ------------------------------------------------------------------------------ what is converted


def _encoded(img: Image.Image, fmt: str, **options: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **options)
    return buf.getvalue()


def _rgb() -> np.ndarray:
    return RNG.integers(0, 256, (H, W, 3), dtype=np.uint8)


def _png_16_bit_rgb(values: np.ndarray) -> bytes:
    """A 16-bit RGB PNG written by hand (PIL cannot write one; it reads it as 8-bit "RGB")."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\0" + row.astype(">u2").tobytes() for row in values)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 16, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _pixels_of(data: bytes) -> np.ndarray:
    """The file's own pixels as PIL decodes them, never turned (lossy formats: what was stored)."""
    return np.asarray(Image.open(io.BytesIO(data)))


def case_rgb_png():
    # Another encoder's choices (PIL's default level is 6): re-encoding would change the bytes.
    data = _encoded(Image.fromarray(px := _rgb()), "PNG", compress_level=1)
    return data, "as read", px


def case_cmyk_jpeg():
    data = _encoded(Image.fromarray(_rgb()).convert("CMYK"), "JPEG", quality=95)
    c = _pixels_of(data).astype(np.float64)  # the decoded CMYK samples
    return data, "PNG", np.rint((255 - c[..., :3]) * (255 - c[..., 3:]) / 255).astype(np.uint8)


def case_16_bit_rgb_png():
    values = RNG.integers(0, 65536, (H, W, 3)).astype(np.uint16)
    return _png_16_bit_rgb(values), "PNG", (values >> 8).astype(np.uint8)


def case_png_with_a_transparent_colour():
    px = _rgb()
    px[:10] = (1, 2, 3)
    expected = px.copy()
    expected[(px == (1, 2, 3)).all(-1)] = 255  # composited over white
    return _encoded(Image.fromarray(px), "PNG", transparency=(1, 2, 3)), "PNG", expected


def case_jpeg_turned_by_exif():
    """Stored as read, `datasets` would turn it (96x128): the annotation is in its own pixels."""
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90
    data = _encoded(Image.fromarray(_rgb()), "JPEG", quality=95, exif=exif.tobytes())
    return data, "PNG", _pixels_of(data)


def case_gray_jpeg():
    data = _encoded(Image.fromarray(_rgb()[..., 0]), "JPEG", quality=95)
    return data, "PNG", np.repeat(_pixels_of(data)[..., None], 3, axis=2)


def case_jpeg_with_trailing_data():
    """2 MiB after the image (past the bound): the pixels are stored, not what follows them."""
    data = _encoded(Image.fromarray(_rgb()), "JPEG", quality=95)
    return data + b"private" * (300 << 10), "PNG", _pixels_of(data)


def case_webp():
    data = _encoded(Image.fromarray(px := _rgb()), "WEBP", lossless=True)
    return data, "PNG", px


CASES: dict[str, Callable[[], tuple[bytes, str, np.ndarray]]] = {
    "rgb-png": case_rgb_png,
    "cmyk-jpeg": case_cmyk_jpeg,
    "16-bit-rgb-png": case_16_bit_rgb_png,
    "transparent-colour": case_png_with_a_transparent_colour,
    "exif-rotated": case_jpeg_turned_by_exif,
    "gray-jpeg": case_gray_jpeg,
    "trailing-data": case_jpeg_with_trailing_data,
    "webp": case_webp,
}


@pytest.fixture(scope="module")
def mixed_build(tmp_path_factory) -> dict[str, Any]:
    """One coco-captions build of a fixture whose first images are replaced by the cases (the
    file keeps its name: builders look at the content, not the extension)."""
    base = tmp_path_factory.mktemp("image_bytes")
    root = write_coco_fixture(base / "coco", CocoFixtureConfig(n_images=24))
    files = source_files(root)
    expected = {}
    for (name, make), image_id in zip(CASES.items(), sorted(files), strict=False):
        data, stored, pixels = make()
        files[image_id].write_bytes(data)
        expected[name] = (image_id, data, stored, pixels)
    out = base / "out"
    assert captions_build(root, out) == 0
    manifest = manifest_of(out)
    assert manifest["errors"] == {} and manifest["skipped"] == {}
    stored = {}
    for key in manifest["outputs"]:
        if key.startswith("default/"):
            stored.update(cells(out, key))
    loaded = {
        row["image_id"]: np.asarray(row["image"])
        for split in ("train", "restval", "val", "test")
        for row in datasets.load_dataset(str(out), split=split)
    }
    return {"expected": expected, "stored": stored, "loaded": loaded}


@pytest.mark.parametrize("case", list(CASES))
def test_each_image_is_stored_as_read_or_converted_as_png(mixed_build, case):
    image_id, data, how, pixels = mixed_build["expected"][case]
    cell = mixed_build["stored"][image_id]
    assert cell["path"] is None
    if how == "as read":
        assert cell["bytes"] == data
    else:
        assert cell["bytes"] != data and decoded(cell).format == "PNG"
        assert decoded(cell).mode == "RGB"
    assert pixels.shape == (H, W, 3)
    assert np.array_equal(np.asarray(decoded(cell).convert("RGB")), pixels)
    # What load_dataset gives is the same pixels (not turned by EXIF, not 16-bit).
    assert np.array_equal(mixed_build["loaded"][image_id], pixels)


# ------------------------------------------------------------------------------ other builders


def test_decorrelation_keeps_the_original_as_read_and_its_own_images_png(tmp_path, tiny_models_dir, nltk_data_dir):
    root = write_coco_fixture(tmp_path / "coco", CocoFixtureConfig(n_images=8))
    out = tmp_path / "out"
    assert (
        cli_main(
            [
                "build",
                "decorrelation",
                "--coco-root",
                str(root),
                "--output",
                str(out),
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--fill",
                "zero",
                "--image-size",
                "64",
                "--keep-original",
                "--products",
                "odmap",
            ]
        )
        == 0
    )
    files = source_files(root)
    originals = cells(out, "odmap_queries/test", "original_image")
    assert originals
    for image_id, cell in originals.items():
        assert cell == {"bytes": files[image_id].read_bytes(), "path": None}
    for column in ("image", "mask"):  # generated: lossless PNG
        assert {decoded(c).format for c in cells(out, "odmap_queries/test", column).values()} == {"PNG"}
    assert manifest_of(out)["config"]["image_encoding"]


def test_eccv_positives_stores_each_jpeg_byte_for_byte(tmp_path):
    images = sorted(package_json("eccv", "i2t"))[:3]
    root = write_test_image_root(tmp_path / "coco", {i: [1] for i in images})
    out = tmp_path / "out"
    assert cli_main(["build", "eccv-positives", "--coco-root", str(root), "--output", str(out)]) == 0
    stored = {i: c for i, c in cells(out, "i2t/test").items() if c is not None}
    assert sorted(stored) == images
    for image_id, cell in stored.items():
        path = root / "val2014" / f"COCO_val2014_{image_id:012d}.jpg"
        assert decoded({"bytes": path.read_bytes()}).format == "JPEG"
        assert cell == {"bytes": path.read_bytes(), "path": None}
    assert manifest_of(out)["config"]["image_encoding"]
