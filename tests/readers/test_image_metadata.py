"""`loading_scripts/image_metadata.py` (issue 41): `strip_metadata` drops EXIF, XMP and comments
from JPEGs and PNGs without re-encoding. Checked against PIL as the independent reader: the same
pixels, no EXIF, no comment, the ICC profile kept; for every JPEG coding PIL writes (baseline,
progressive, restart intervals, CMYK with its Adobe segment). Hostile bytes (cut, flipped) give
`MetadataNotStripped` or a JPEG, never another exception.

Issue 49: the rule is an allow-list, so every hiding place a prefix or deny-list rule kept (a
JFIF or JFXX thumbnail, GPS after or instead of an ICC profile, an Adobe segment longer than its
fields, a PNG caBX or private chunk, a PNG profile followed by an EXIF) leaves no EXIF, XMP or GPS
byte behind (a byte scan, independent of the code's parsing). `loading_scripts/image_gps.py`
finds a GPS position wherever it sits (XMP, an MPO's second frame, a second EXIF, between scans),
calls an EXIF it cannot read "unread", and flags nothing in images without one."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageCms, PngImagePlugin

from loading_scripts.image_gps import gps_check
from loading_scripts.image_metadata import MetadataNotStripped, strip_metadata

from helpers.image_metadata_helpers import (
    GPS_XMP,
    gps_exif,
    gps_hiding_places,
    leaks,
    strip_variants,
    unreadable_exif,
)

GPS_IFD = 0x8825


def exif() -> Image.Exif:
    ex = Image.Exif()
    ex[0x0110] = "PhoneCam 3"
    gps = ex.get_ifd(GPS_IFD)
    gps[1], gps[2] = "N", (52.0, 31.0, 12.0)
    return ex


def pixels(mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8))
    return img.convert(mode)


def saved(img: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


SRGB = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
CASES = {
    "baseline": ("RGB", "JPEG", {"quality": 90}),
    "progressive": ("RGB", "JPEG", {"progressive": True}),
    "restart-intervals": ("RGB", "JPEG", {"restart_marker_blocks": 1}),
    "icc-profile": ("RGB", "JPEG", {"icc_profile": SRGB}),
    "cmyk-adobe": ("CMYK", "JPEG", {}),
    "grayscale": ("L", "JPEG", {}),
    "png": ("RGB", "PNG", {}),
    "png-icc-profile": ("RGB", "PNG", {"icc_profile": SRGB}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stripped_images_decode_to_the_same_pixels_without_metadata(case):
    mode, fmt, kwargs = CASES[case]
    extra = {"comment": b"at home"} if fmt == "JPEG" else {}
    data = saved(pixels(mode), fmt, exif=exif(), **extra, **kwargs)
    source = Image.open(io.BytesIO(data))
    assert source.getexif().get_ifd(GPS_IFD) and gps_check(data).found  # the source does carry it

    stored_bytes = strip_metadata(data + b"after the end: another image's EXIF")
    stored = Image.open(io.BytesIO(stored_bytes))
    assert stored.format == fmt and stored.mode == source.mode
    assert np.array_equal(np.asarray(stored), np.asarray(source))
    assert dict(stored.getexif()) == {} and not gps_check(stored_bytes).flagged
    assert "comment" not in stored.info and "exif" not in stored.info
    assert stored.info.get("icc_profile") == source.info.get("icc_profile")  # colours kept
    if case == "cmyk-adobe":
        assert stored.info.get("adobe") == source.info.get("adobe")


def test_other_formats_are_refused_not_passed():
    with pytest.raises(MetadataNotStripped):
        strip_metadata(saved(pixels(), "WEBP", exif=exif()))


def corrupted(data: bytes, seed: int, n: int = 400):
    """`n` copies of `data`, every other one cut, each with 1 to 4 bytes past the first two changed."""
    rng = np.random.default_rng(seed)
    for k in range(n):
        bad = bytearray(data)
        if k % 2:
            bad = bad[: rng.integers(3, len(bad))]
        for _ in range(rng.integers(1, 5)):
            bad[rng.integers(2, len(bad))] = rng.integers(0, 256)
        yield bytes(bad)


def test_hostile_bytes_raise_only_metadata_not_stripped():
    data = saved(pixels(), "JPEG", exif=exif(), progressive=True)
    for bad in corrupted(data, 41):
        try:
            out = strip_metadata(bad)
        except MetadataNotStripped:
            continue
        assert out.startswith(b"\xff\xd8") and out.endswith(b"\xff\xd9") and len(out) <= len(bad)


def test_hostile_pngs_raise_only_metadata_not_stripped():
    data = strip_variants()["png-iccp-then-gps"]
    for bad in corrupted(data, 49):
        try:
            out = strip_metadata(bad)
        except MetadataNotStripped:
            continue
        assert out.startswith(b"\x89PNG") and out[-8:-4] == b"IEND"


@pytest.mark.parametrize("name", ["app1-exif-xmp-comment-and-a-second-image", "exif-between-scans", "png-cabx"])
def test_hostile_bytes_never_make_the_gps_check_raise(name):
    for bad in corrupted(strip_variants()[name], 7):
        assert isinstance(gps_check(bad).flagged, bool)


@pytest.mark.parametrize("name", list(strip_variants()))
def test_every_hiding_place_is_stripped_and_the_pixels_stay(name):
    data = strip_variants()[name]
    assert leaks(data)  # the source does hide a GPS position
    stored = strip_metadata(data)
    assert leaks(stored) == []
    before, after = Image.open(io.BytesIO(data)), Image.open(io.BytesIO(stored))
    assert after.format == before.format and after.mode == before.mode
    assert np.array_equal(np.asarray(after), np.asarray(before))


def test_the_fixed_fields_decoding_reads_are_kept():
    """A JFIF thumbnail goes but the densities stay; a CMYK file's Adobe transform stays."""
    data = strip_variants()["jfif-thumbnail"]
    assert Image.open(io.BytesIO(strip_metadata(data))).info["dpi"] == Image.open(io.BytesIO(data)).info["dpi"]
    cmyk = saved(pixels("CMYK"), "JPEG")
    assert Image.open(io.BytesIO(strip_metadata(cmyk))).info["adobe_transform"] == 0


@pytest.mark.parametrize("name", list(gps_hiding_places()))
def test_gps_is_found_wherever_it_sits(name):
    data = gps_hiding_places()[name]
    assert not Image.open(io.BytesIO(data)).getexif().get_ifd(GPS_IFD)  # PIL's first EXIF has none
    assert gps_check(data).found


@pytest.mark.parametrize("chunk", ["itxt-xmp", "ztxt-raw-profile"])
def test_gps_in_a_pngs_compressed_text_is_found(chunk):
    """XMP in a compressed iTXt; ImageMagick's hex "Raw profile type exif" in a zTXt."""
    info = PngImagePlugin.PngInfo()
    if chunk == "itxt-xmp":
        info.add_itxt("XML:com.adobe.xmp", GPS_XMP.decode(), zip=True)
    else:
        info.add_text("Raw profile type exif", f"\nexif\n{len(gps_exif())}\n{gps_exif().hex()}\n", zip=True)
    data = saved(pixels(), "PNG", pnginfo=info)
    assert not leaks(data) and gps_check(data).found  # compressed: no byte scan sees it
    assert not gps_check(strip_metadata(data)).flagged


def test_an_exif_that_cannot_be_read_is_flagged_as_unread():
    check = gps_check(unreadable_exif())
    assert not check.found and check.unread and check.flagged


@pytest.mark.parametrize("case", list(CASES))
def test_images_without_gps_are_not_flagged(case):
    mode, fmt, kwargs = CASES[case]
    ex = Image.Exif()
    ex[0x0110] = "PhoneCam 3"
    extra = {"comment": b"at home"} if fmt == "JPEG" else {}
    data = saved(pixels(mode), fmt, exif=ex, **extra, **kwargs)
    assert not gps_check(data).flagged
    assert gps_check(strip_metadata(data)) == gps_check(data)
