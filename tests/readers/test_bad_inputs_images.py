"""Source images that used to corrupt a build silently or blow up its memory (issue #21 §2).

- Every PIL mode becomes the RGB the README documents, checked against conversions computed here
  with numpy from the pixel arrays the test wrote (not by calling the code under test): a 16-bit
  grayscale PNG used to be embedded as pure white.
- A float or 32-bit image whose values the policy cannot map is a counted
  `image_values_out_of_range`, never clipped.
- An image whose size differs from its annotation is a counted `image_size_mismatch` in every
  builder that has annotations (its boxes would be wrong); coco-captions embedded it.
- An image over `--max-image-pixels` (a 9000x9000 PNG of a few kB annotated as 128x96) is a
  counted `image_too_large`, refused from its header: it is never decoded.
Every counted case also asserts that every other row is identical to a clean build.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageFile

from builders.app.cli import main as cli_main

from helpers.build_helpers import (
    captions_build,
    decorrelation_build,
    eccv_build,
    errors_everywhere,
    fixture_case,
    without_target,
)
from helpers.build_helpers import rows_by_output
from helpers.eccv_fixtures import package_json, write_test_image_root

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

W, H = 128, 96  # the fixture's image size
RNG = np.random.default_rng(21)


def composite_over_white(rgb: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    rgb, alpha = rgb.astype(np.float64), alpha.astype(np.float64)[..., None]
    return np.rint((rgb * alpha + 255.0 * (255.0 - alpha)) / 255.0).astype(np.uint8)


def gray(values: np.ndarray) -> np.ndarray:
    return np.repeat(values.astype(np.uint8)[..., None], 3, axis=2)


def _u8(*shape: int) -> np.ndarray:
    return RNG.integers(0, 256, (H, W, *shape), dtype=np.uint8).squeeze()


def _palette_case(mode: str):
    index = RNG.integers(0, 16, (H, W), dtype=np.uint8)
    palette = RNG.integers(0, 256, (16, 3), dtype=np.uint8)
    if mode == "P":  # transparency per palette entry (PNG tRNS), two entries fully transparent
        alphas = RNG.integers(0, 256, 16, dtype=np.uint8)
        alphas[:2] = 0
        img = Image.frombytes("P", (W, H), index.tobytes())
        img.putpalette(palette.flatten().tolist())
        return img, "PNG", {"transparency": bytes(alphas)}, composite_over_white(palette[index], alphas[index])
    alpha = _u8()
    img = Image.frombytes("PA", (W, H), np.stack([index, alpha], -1).tobytes())
    img.putpalette(palette.flatten().tolist())
    return img, "TIFF", {}, composite_over_white(palette[index], alpha)


def _ycbcr_case():
    ycc = _u8(3)
    y, cb, cr = (ycc[..., i].astype(np.float64) for i in range(3))
    cb, cr = cb - 128, cr - 128
    rgb = np.stack([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb], -1)
    return Image.frombytes("YCbCr", (W, H), ycc.tobytes()), "TIFF", {}, np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def mode_cases() -> dict[str, Callable[[], tuple[Image.Image, str, dict, np.ndarray]]]:
    """mode -> () -> (image in that mode, file format, save options, expected RGB)."""

    def sixteen(mode: str, fmt: str):
        v = RNG.integers(0, 65536, (H, W)).astype(np.uint16)
        stored = v.astype(">u2" if mode == "I;16B" else "<u2").tobytes()
        return Image.frombytes(mode, (W, H), stored), fmt, {}, gray(v >> 8)

    def bits():
        b = RNG.random((H, W)) > 0.5
        return Image.fromarray(b), "PNG", {}, gray(np.where(b, 255, 0))

    def la():
        la = _u8(2)
        return Image.fromarray(la), "PNG", {}, composite_over_white(gray(la[..., 0]), la[..., 1])

    def rgba():
        px = _u8(4)
        return Image.fromarray(px), "PNG", {}, composite_over_white(px[..., :3], px[..., 3])

    def cmyk():
        c = _u8(4).astype(np.float64)
        rgb = np.rint((255 - c[..., :3]) * (255 - c[..., 3:]) / 255).astype(np.uint8)
        return Image.frombytes("CMYK", (W, H), c.astype(np.uint8).tobytes()), "TIFF", {}, rgb

    def int32():
        v = RNG.integers(0, 65536, (H, W)).astype(np.int32)
        return Image.fromarray(v), "TIFF", {}, gray(v >> 8)

    def float32():
        v = RNG.random((H, W)).astype(np.float32)
        v[0, :2] = (0.0, 1.0)
        return Image.fromarray(v), "TIFF", {}, gray(np.rint(v.astype(np.float64) * 255))

    def rgb():
        px = _u8(3)
        return Image.fromarray(px), "PNG", {}, px

    def lum():
        v = _u8()
        return Image.fromarray(v), "PNG", {}, gray(v)

    return {
        "1": bits,
        "L": lum,
        "LA": la,
        "P": lambda: _palette_case("P"),
        "PA": lambda: _palette_case("PA"),
        "RGB": rgb,
        "RGBA": rgba,
        "CMYK": cmyk,
        "YCbCr": _ycbcr_case,
        "I;16": lambda: sixteen("I;16", "PNG"),
        "I;16B": lambda: sixteen("I;16B", "TIFF"),
        "I": int32,
        "F": float32,
    }


def write_mode_image(path: Path, mode: str) -> np.ndarray:
    img, fmt, options, expected = mode_cases()[mode]()
    img.save(path, format=fmt, **options)
    with Image.open(path) as check:  # the file really holds the mode under test
        assert check.mode == mode, (check.mode, mode)
    return expected


def embedded_image(out: Path, key: str, image_id: int, column: str = "image") -> np.ndarray:
    manifest = json.loads((out / "build_manifest.json").read_text())
    for shard in manifest["outputs"][key]["shards"]:
        for row in pq.read_table(out / shard).to_pylist():
            if row["image_id"] == image_id:
                return np.asarray(Image.open(io.BytesIO(row[column]["bytes"])))
    raise AssertionError(f"no {key} row of image {image_id}")


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("image_modes")
    clean = fixture_case(base)
    assert captions_build(clean["root"], base / "clean") == 0
    return {**clean, "rows": rows_by_output(base / "clean")}


def copy_case(clean: dict, tmp_path: Path) -> dict[str, Any]:
    root = tmp_path / "coco"
    shutil.copytree(clean["root"], root)
    return {**clean, "root": root, "image": root / clean["image"].relative_to(clean["root"]), "out": tmp_path / "out"}


@pytest.fixture(scope="module")
def decorrelation(coco, tmp_path_factory, tiny_models_dir, nltk_data_dir) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("image_modes_decorrelation") / "clean"
    assert decorrelation_build(coco["root"], out, tiny_models_dir) == 0
    return {**coco, "rows": rows_by_output(out)}


@pytest.fixture(scope="module")
def eccv(tmp_path_factory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("image_modes_eccv")
    images = sorted(package_json("eccv", "i2t"))[:4]
    root = write_test_image_root(base / "coco", {i: [1] for i in images})
    assert eccv_build(root, base / "clean") == 0
    return {
        "root": root,
        "folder": "val2014",
        "target": images[1],
        "size": (8, 6),
        "image": root / "val2014" / f"COCO_val2014_{images[1]:012d}.jpg",
        "rows": rows_by_output(base / "clean"),
    }


# ------------------------------------------------------------------------------ modes


@pytest.mark.parametrize("mode", list(mode_cases()))
def test_every_mode_is_embedded_as_the_documented_rgb(coco, tmp_path, mode):
    case = copy_case(coco, tmp_path)
    expected = write_mode_image(case["image"], mode)
    assert captions_build(case["root"], case["out"]) == 0
    assert errors_everywhere(case["out"]) == ({}, {})
    got = embedded_image(case["out"], "default/test", case["target"])
    assert got.shape == (H, W, 3)
    # PIL converts YCbCr in fixed point: within one level of the exact BT.601 formula.
    tolerance = 1 if mode == "YCbCr" else 0
    assert np.abs(got.astype(int) - expected.astype(int)).max() <= tolerance
    assert _without_pixels(rows_by_output(case["out"]), case["target"]) == _without_pixels(
        coco["rows"], case["target"]
    )


def _without_pixels(rows: dict[str, list[dict]], image_id: int) -> dict[str, list[dict]]:
    return {
        key: [{**r, "image": None} if r.get("image_id") == image_id and "image" in r else r for r in rs]
        for key, rs in rows.items()
    }


def test_a_16_bit_png_keeps_its_pixels_in_decorrelation(decorrelation, tmp_path, tiny_models_dir):
    """The issue's case in the other builder that embeds source pixels (`--keep-original`)."""
    case = copy_case(decorrelation, tmp_path)
    v = RNG.integers(0, 65536, (H, W)).astype(np.uint16)
    Image.fromarray(v).save(case["image"], format="PNG")
    assert (
        cli_main(
            [
                "build",
                "decorrelation",
                "--coco-root",
                str(case["root"]),
                "--output",
                str(case["out"]),
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
    got = embedded_image(case["out"], "odmap_queries/test", case["target"], "original_image")
    assert np.array_equal(got, gray(v >> 8))


@pytest.mark.parametrize(
    "mode, values",
    [
        pytest.param("F", [0.5, 1.5], id="float-above-1"),
        pytest.param("F", [-0.1, 0.5], id="float-negative"),
        pytest.param("F", [0.5, float("nan")], id="float-nan"),
        pytest.param("I", [0, 70000], id="int32-above-16-bit"),
        pytest.param("I", [-1, 10], id="int32-negative"),
    ],
)
def test_values_the_policy_cannot_map_are_counted_not_clipped(coco, tmp_path, mode, values):
    case = copy_case(coco, tmp_path)
    pixels = np.full((H, W), values[0], dtype=np.float32 if mode == "F" else np.int32)
    pixels[0, 0] = values[1]
    Image.fromarray(pixels).save(case["image"], format="TIFF")
    assert captions_build(case["root"], case["out"]) == 0
    assert errors_everywhere(case["out"]) == ({"image_values_out_of_range": 1},) * 2
    assert rows_by_output(case["out"]) == without_target(coco["rows"], case["target"])


# ------------------------------------------------------------------------------ size and bound


def _mismatched(case: dict) -> None:
    w, h = case["size"]
    Image.new("RGB", (w + 3, h), (10, 20, 30)).save(case["image"], format="PNG")


class LoadSpy:
    """Records the size of every image file PIL decodes."""

    def __init__(self, monkeypatch) -> None:
        self.sizes: list[tuple[int, int]] = []
        real = ImageFile.ImageFile.load

        def load(img):
            self.sizes.append(img.size)
            return real(img)

        monkeypatch.setattr(ImageFile.ImageFile, "load", load)


def _huge(case: dict) -> None:
    # One colour compresses to a few kB, yet decodes to 81 Mpx (under PIL's 89.5 Mpx bomb limit).
    Image.new("1", (9000, 9000), 1).save(case["image"], format="PNG")
    assert case["image"].stat().st_size < 100_000


def _counted(case: dict, clean_rows: dict, reason: str) -> None:
    assert errors_everywhere(case["out"]) == ({reason: 1}, {reason: 1})
    assert rows_by_output(case["out"]) == without_target(clean_rows, case["target"])


@pytest.mark.parametrize(
    "make, reason",
    [(_mismatched, "image_size_mismatch"), (_huge, "image_too_large")],
    ids=["size-mismatch", "too-large"],
)
def test_coco_captions_counts_the_image(coco, tmp_path, monkeypatch, make, reason):
    case = copy_case(coco, tmp_path)
    make(case)
    spy = LoadSpy(monkeypatch)
    assert captions_build(case["root"], case["out"]) == 0
    assert (9000, 9000) not in spy.sizes and spy.sizes, "the huge image was decoded"
    _counted(case, coco["rows"], reason)


@pytest.mark.parametrize(
    "make, reason",
    [(_mismatched, "image_size_mismatch"), (_huge, "image_too_large")],
    ids=["size-mismatch", "too-large"],
)
def test_decorrelation_counts_the_image(decorrelation, tmp_path, tiny_models_dir, monkeypatch, make, reason):
    case = copy_case(decorrelation, tmp_path)
    make(case)
    spy = LoadSpy(monkeypatch)
    assert decorrelation_build(case["root"], case["out"], tiny_models_dir) == 0
    assert (9000, 9000) not in spy.sizes
    assert errors_everywhere(case["out"]) == ({reason: 1}, {reason: 1})
    # Its removal rows are skipped; its captions stay in the ODmAP gallery (text, no pixels), as
    # for an unreadable image.
    expected = without_target(decorrelation["rows"], case["target"])
    expected["odmap_gallery/test"] = decorrelation["rows"]["odmap_gallery/test"]
    assert expected != decorrelation["rows"]
    assert rows_by_output(case["out"]) == expected


@pytest.mark.parametrize(
    "make, reason",
    [(_mismatched, "image_size_mismatch"), (_huge, "image_too_large")],
    ids=["size-mismatch", "too-large"],
)
def test_eccv_positives_counts_the_image(eccv, tmp_path, monkeypatch, make, reason):
    case = copy_case(eccv, tmp_path)
    make(case)
    spy = LoadSpy(monkeypatch)
    assert eccv_build(case["root"], case["out"]) == 0
    assert (9000, 9000) not in spy.sizes
    assert errors_everywhere(case["out"]) == ({reason: 1}, {reason: 1})
    rows = rows_by_output(case["out"])
    assert rows["i2t/test"] == [r for r in eccv["rows"]["i2t/test"] if r["image_id"] != case["target"]]
    assert rows["t2i/test"] == eccv["rows"]["t2i/test"]


def test_max_image_pixels_is_the_bound(coco, tmp_path):
    """A 200x200 image, annotated so: embedded by default, counted under a 20,000-pixel bound."""
    case = copy_case(coco, tmp_path)
    Image.new("RGB", (200, 200), (1, 2, 3)).save(case["image"], format="PNG")
    for path in (case["root"] / "annotations").glob(f"*_{case['folder']}.json"):
        data = json.loads(path.read_text())
        for entry in data["images"]:
            if entry["id"] == case["target"]:
                entry["width"] = entry["height"] = 200
        path.write_text(json.dumps(data))
    assert captions_build(case["root"], tmp_path / "default") == 0
    assert embedded_image(tmp_path / "default", "default/test", case["target"]).shape == (200, 200, 3)
    assert (
        cli_main(
            [
                "build",
                "coco-captions",
                "--coco-root",
                str(case["root"]),
                "--splits",
                "test",
                "val",
                "--output",
                str(case["out"]),
                "--part-size",
                "2",
                "--max-error-fraction",
                "0.5",
                "--max-image-pixels",
                "20000",
            ]
        )
        == 0
    )
    _counted(case, coco["rows"], "image_too_large")
