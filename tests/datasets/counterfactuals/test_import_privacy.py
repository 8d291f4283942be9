"""`build coco-counterfactuals --images-from` (issue 41): what an imported image may cost and carry.

- Memory: an image file over `--max-image-bytes` (a JPEG padded with zeros, as a hostile zip
  holds) is counted `image_too_large`, unread; the flag raises the bound. A part's image bytes are
  bounded too: a pair past the bound is `part_too_large`, an input error naming `--part-size`.
- Privacy: the images are stored byte for byte, EXIF (GPS position included) and all, unless
  `--strip-metadata` drops EXIF, XMP and comments without re-encoding: PIL (an independent reader)
  then finds no EXIF and no GPS, and decodes the same pixels as from the source file. The card
  says which was done, and `counterfactory show` flags the images that carry a GPS position.
- Issue 49: whatever segment or chunk hides a GPS position (a JFIF or JFXX thumbnail, an ICC or
  Adobe segment with more than its profile or fields, a PNG caBX or private chunk, ...), no EXIF,
  XMP or GPS byte is left after `--strip-metadata` (a byte scan); and `show` flags a GPS position
  wherever it sits (XMP, an MPO's second frame, a second EXIF, between scans), and an image whose
  EXIF cannot be read as "GPS: unknown", treated as present.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from builders.app.cli import main as cli_main
from builders.counterfactuals import imports

from helpers.gallery_helpers import page_records, show
from helpers.image_metadata_helpers import gps_hiding_places, leaks, plain_jpeg, strip_variants, unreadable_exif

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

ROWS = [
    ("A17", "A man riding a horse on a beach.", "A man riding a cow on a beach."),
    ("9", "Two dogs sleep on the couch.", "Two cats sleep on the couch."),
    ("x5", "A bus on the street.", "A truck on the street."),
    ("b8", "A plate of pasta.", "A plate of rice."),
]
GPS_IFD = 0x8825
#: Text in the EXIF that the gallery must never render as markup.
HOSTILE = "<script>alert(1)</script>"


def jpeg(seed: int, exif: bool = False, size: int = 48) -> bytes:
    """A JPEG of random pixels; with `exif`, an EXIF with a camera, a description, an
    orientation and a GPS position, a comment and an XMP packet (what a phone's photo carries)."""
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (size, size + 8, 3), dtype=np.uint8))
    buf = io.BytesIO()
    extra = {}
    if exif:
        ex = Image.Exif()
        ex[0x0110], ex[0x010E], ex[0x0112] = "PhoneCam 3", HOSTILE, 6
        gps = ex.get_ifd(GPS_IFD)
        gps[1], gps[2], gps[3], gps[4] = "N", (52.0, 31.0, 12.0), "E", (13.0, 24.0, 18.0)
        xmp = b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF/></x:xmpmeta>'
        extra = {"exif": ex, "comment": b"taken at home", "xmp": xmp}
    img.save(buf, "JPEG", quality=90, **extra)
    return buf.getvalue()


def png_with_exif(seed: int) -> bytes:
    ex = Image.Exif()
    ex[0x0110] = "PhoneCam 3"
    gps = ex.get_ifd(GPS_IFD)
    gps[1], gps[2] = "S", (33.0, 51.0, 54.0)
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(buf, "PNG", exif=ex)
    return buf.getvalue()


def tsv(base: Path, rows: list[tuple[str, str, str]] = ROWS) -> Path:
    path = base / "pairs.tsv"
    path.write_text("".join(f"{i}\t{c0}\t{c1}\n" for i, c0, c1 in rows), encoding="utf-8")
    return path


def release_zip(base: Path, images: dict[str, bytes]) -> Path:
    """The Hub release's layout (`images/{id}_img_{n}.jpg`) holding `images` by member name."""
    path = base / "images.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in images.items():
            zf.writestr(f"images/{name}", data)
    return path


def build(out: Path, tiny: Path, base: Path, images: Path, *extra: str, rows=ROWS) -> dict:
    argv = ["build", "coco-counterfactuals", "--captions-from", str(tsv(base, rows)), "--images-from", str(images)]
    argv += ["--tiny-models-dir", str(tiny), "--output", str(out), "--models", "tiny", "--no-clip-scores"]
    assert cli_main([*argv, "--max-error-fraction", "1", *extra]) == 0
    return json.loads((out / "build_manifest.json").read_text())


def rows_by_id(out: Path) -> dict[str, dict]:
    manifest = json.loads((out / "build_manifest.json").read_text())
    shards = manifest["outputs"]["default/test"]["shards"]
    return {r["id"]: r for shard in shards for r in pq.read_table(out / shard).to_pylist()}


def padded(data: bytes, extra: int) -> bytes:
    """A valid JPEG followed by `extra` zero bytes (deflated to almost nothing in a zip)."""
    return data + bytes(extra)


def test_an_image_file_over_the_byte_bound_is_counted_unread(tmp_path, tiny_models_dir):
    big = 17 << 20  # over the default --max-image-bytes (16 MiB), far over any real image here
    images = {f"{i}_img_{n}.jpg": jpeg(k * 2 + n) for k, (i, _, _) in enumerate(ROWS) for n in (0, 1)}
    images["9_img_0.jpg"] = padded(images["9_img_0.jpg"], big)
    images["x5_img_1.jpg"] = padded(images["x5_img_1.jpg"], 2 * big)
    source = release_zip(tmp_path, images)
    assert source.stat().st_size < 1 << 20  # a small zip asking for tens of MB per member

    manifest = build(tmp_path / "out", tiny_models_dir, tmp_path, source)
    assert manifest["errors"] == {"image_too_large": 2}
    rows = rows_by_id(tmp_path / "out")
    assert sorted(rows) == ["A17", "b8"]
    assert rows["A17"]["image_0"]["bytes"] == images["A17_img_0.jpg"]

    # The flag raises the bound: the padded file is then an image like any other.
    manifest = build(tmp_path / "raised", tiny_models_dir, tmp_path, source, "--max-image-bytes", str(3 * big))
    assert manifest["errors"] == {}
    assert rows_by_id(tmp_path / "raised")["9"]["image_0"]["bytes"] == images["9_img_0.jpg"]


def test_a_parts_image_bytes_are_bounded(tmp_path, tiny_models_dir, monkeypatch):
    """Each pair holds 2 x 1.2 MB; with a part bound of 5 MB a part of 4 pairs keeps its first
    two and counts the other two `part_too_large` (the test lowers the bound the code defines,
    256 MiB, so that the case is small)."""
    monkeypatch.setattr(imports, "PART_IMAGE_BYTES", 5_000_000)
    images = {
        f"{i}_img_{n}.jpg": padded(jpeg(k * 2 + n), 1_200_000) for k, (i, _, _) in enumerate(ROWS) for n in (0, 1)
    }
    source = release_zip(tmp_path, images)
    manifest = build(tmp_path / "out", tiny_models_dir, tmp_path, source, "--part-size", "4")
    assert manifest["errors"] == {"part_too_large": 2}
    assert sorted(rows_by_id(tmp_path / "out")) == ["9", "A17"]
    # Smaller parts hold every pair.
    manifest = build(tmp_path / "small", tiny_models_dir, tmp_path, source, "--part-size", "1")
    assert manifest["errors"] == {} and len(rows_by_id(tmp_path / "small")) == len(ROWS)


def private_source(base: Path) -> tuple[Path, dict[str, bytes]]:
    """A folder in the `numbered` layout: A17's images carry EXIF with GPS, a comment and XMP;
    9's image 0 is a PNG with a GPS EXIF chunk; the others carry nothing."""
    folder = base / "photos"
    folder.mkdir()
    images = {}
    for k, (i, _, _) in enumerate(ROWS):
        for n in (0, 1):
            data = png_with_exif(k) if (i, n) == ("9", 0) else jpeg(k * 2 + n, exif=i == "A17")
            name = f"{i}_{n}.png" if (i, n) == ("9", 0) else f"{i}_{n}.jpg"
            (folder / name).write_bytes(data)
            images[f"{i}_{n}"] = data
    return folder, images


def test_strip_metadata_drops_exif_and_keeps_the_pixels(tmp_path, tiny_models_dir):
    folder, images = private_source(tmp_path)
    kept = tmp_path / "kept"
    build(kept, tiny_models_dir, tmp_path, folder)
    for i, row in rows_by_id(kept).items():  # byte for byte, metadata and all
        assert (row["image_0"]["bytes"], row["image_1"]["bytes"]) == (images[f"{i}_0"], images[f"{i}_1"])
    card = (kept / "README.md").read_text()
    assert "Image metadata: kept." in card and "Image metadata: stripped" not in card

    stripped = tmp_path / "stripped"
    manifest = build(stripped, tiny_models_dir, tmp_path, folder, "--strip-metadata")
    assert manifest["errors"] == {}
    rows = rows_by_id(stripped)
    assert sorted(rows) == sorted(i for i, _, _ in ROWS)
    for i, row in rows.items():
        for n in (0, 1):
            source = Image.open(io.BytesIO(images[f"{i}_{n}"]))
            stored = Image.open(io.BytesIO(row[f"image_{n}"]["bytes"]))
            assert stored.format == source.format  # not re-encoded to another format
            assert np.array_equal(np.asarray(stored), np.asarray(source)), (i, n)
            assert dict(stored.getexif()) == {} and not stored.getexif().get_ifd(GPS_IFD)
            assert not {"exif", "comment", "xmp", "XML:com.adobe.xmp"} & set(stored.info), (i, n, stored.info)
    a17, png = (Image.open(io.BytesIO(images[name])) for name in ("A17_0", "9_0"))
    assert a17.getexif().get_ifd(GPS_IFD) and a17.info.get("comment")  # the sources did carry them
    assert png.format == "PNG" and png.getexif().get_ifd(GPS_IFD)
    # The JPEG's compressed data is the source's: only metadata segments were left out.
    stored = rows["A17"]["image_0"]["bytes"]
    assert len(stored) < len(images["A17_0"]) and stored[-2000:] == images["A17_0"][-2000:]
    card = (stripped / "README.md").read_text()
    assert "Image metadata: stripped." in card and "--strip-metadata" in card


def test_show_flags_images_that_carry_gps(tmp_path, tiny_models_dir):
    folder, _ = private_source(tmp_path)
    kept, stripped = tmp_path / "kept", tmp_path / "stripped"
    build(kept, tiny_models_dir, tmp_path, folder)
    build(stripped, tiny_models_dir, tmp_path, folder, "--strip-metadata")

    assert show(kept, "--output", tmp_path / "g-kept") == 0
    flagged = {(r["id"], im["label"]) for r in page_records(tmp_path / "g-kept") for im in r["imgs"] if im.get("gps")}
    labels = [im["label"] for im in page_records(tmp_path / "g-kept")[0]["imgs"]]
    assert flagged == {("A17", labels[0]), ("A17", labels[1]), ("9", labels[0])}
    marker = json.loads((tmp_path / "g-kept" / "gallery.json").read_text())
    assert marker["images_with_gps"] == 3
    stats = (tmp_path / "g-kept" / "stats.html").read_text()
    assert "3 images carry a GPS position" in stats
    gallery_text = "".join(p.read_text() for p in (tmp_path / "g-kept").rglob("*") if p.suffix in (".html", ".js"))
    assert HOSTILE not in gallery_text  # the EXIF's text is never copied into the gallery

    assert show(stripped, "--output", tmp_path / "g-stripped") == 0
    assert not any(im.get("gps") for r in page_records(tmp_path / "g-stripped") for im in r["imgs"])
    assert json.loads((tmp_path / "g-stripped" / "gallery.json").read_text())["images_with_gps"] == 0


def numbered(
    base: Path, images: dict[str, bytes]
) -> tuple[Path, list[tuple[str, str, str]], dict[str, tuple[str, int]]]:
    """A folder in the `numbered` layout holding `images` two by two, as pairs p0, p1, ...; its
    caption rows, and image name -> (row id, image index)."""
    folder = base / "hidden"
    folder.mkdir()
    rows, where = [], {}
    for k, (name, data) in enumerate(images.items()):
        row_id, n = f"p{k // 2}", k % 2
        ext = "png" if data.startswith(b"\x89PNG") else "jpg"
        (folder / f"{row_id}_{n}.{ext}").write_bytes(data)
        where[name] = (row_id, n)
        if n == 0:
            rows.append((row_id, f"A photo number {k}.", f"A picture number {k}."))
    return folder, rows, where


def test_strip_metadata_leaves_no_gps_byte_wherever_it_was_hidden(tmp_path, tiny_models_dir):
    images = strip_variants()
    folder, rows, where = numbered(tmp_path, images)
    out = tmp_path / "stripped"
    manifest = build(out, tiny_models_dir, tmp_path, folder, "--strip-metadata", rows=rows)
    assert manifest["errors"] == {}
    stored = rows_by_id(out)
    for name, (row_id, n) in where.items():
        data = stored[row_id][f"image_{n}"]["bytes"]
        assert leaks(images[name]) and leaks(data) == [], name  # the source hid it; nothing is left
        source, kept = Image.open(io.BytesIO(images[name])), Image.open(io.BytesIO(data))
        assert kept.format == source.format and np.array_equal(np.asarray(kept), np.asarray(source)), name
    assert "Image metadata: stripped." in (out / "README.md").read_text()


def test_show_flags_gps_wherever_it_sits(tmp_path, tiny_models_dir):
    images = {**gps_hiding_places(), "unreadable-exif": unreadable_exif(), "none": plain_jpeg(7)}
    folder, rows, where = numbered(tmp_path, images)
    build(tmp_path / "kept", tiny_models_dir, tmp_path, folder, rows=rows)
    assert show(tmp_path / "kept", "--output", tmp_path / "g") == 0

    records = {r["id"]: r["imgs"] for r in page_records(tmp_path / "g")}
    flags = {name: records[row_id][n].get("gps") for name, (row_id, n) in where.items()}
    assert flags == {**dict.fromkeys(gps_hiding_places(), True), "unreadable-exif": "unknown", "none": None}
    marker = json.loads((tmp_path / "g" / "gallery.json").read_text())
    assert (marker["images_with_gps"], marker["images_gps_unknown"]) == (5, 1)
    stats = (tmp_path / "g" / "stats.html").read_text()
    assert "5 images carry a GPS position" in stats and "1 could not be read fully (GPS: unknown)" in stats
    assert "GPS: unknown (could not be read fully) — treated as present" in (tmp_path / "g" / "gallery.js").read_text()
