"""`loading_scripts/image_metadata.py` (issue 41): `strip_metadata` drops EXIF, XMP and comments
from JPEGs and PNGs without re-encoding. Checked against PIL as the independent reader: the same
pixels, no EXIF, no comment, the ICC profile kept; for every JPEG coding PIL writes (baseline,
progressive, restart intervals, CMYK with its Adobe segment). Hostile bytes (cut, flipped) give
`MetadataNotStripped` or a JPEG, never another exception."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageCms

from loading_scripts.image_metadata import MetadataNotStripped, has_gps, strip_metadata

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
}


@pytest.mark.parametrize("case", list(CASES))
def test_stripped_images_decode_to_the_same_pixels_without_metadata(case):
    mode, fmt, kwargs = CASES[case]
    extra = {"comment": b"at home"} if fmt == "JPEG" else {}
    data = saved(pixels(mode), fmt, exif=exif(), **extra, **kwargs)
    source = Image.open(io.BytesIO(data))
    assert source.getexif().get_ifd(GPS_IFD) and has_gps(source)  # the source does carry it

    stored = Image.open(io.BytesIO(strip_metadata(data + b"after the end: another image's EXIF")))
    assert stored.format == fmt and stored.mode == source.mode
    assert np.array_equal(np.asarray(stored), np.asarray(source))
    assert dict(stored.getexif()) == {} and not has_gps(stored)
    assert "comment" not in stored.info and "exif" not in stored.info
    assert stored.info.get("icc_profile") == source.info.get("icc_profile")  # colours kept
    if case == "cmyk-adobe":
        assert stored.info.get("adobe") == source.info.get("adobe")


def test_other_formats_are_refused_not_passed():
    with pytest.raises(MetadataNotStripped):
        strip_metadata(saved(pixels(), "WEBP", exif=exif()))


def test_hostile_bytes_raise_only_metadata_not_stripped():
    data = saved(pixels(), "JPEG", exif=exif(), progressive=True)
    rng = np.random.default_rng(41)
    for k in range(400):
        bad = bytearray(data)
        if k % 2:
            bad = bad[: rng.integers(3, len(bad))]
        for _ in range(rng.integers(1, 5)):
            bad[rng.integers(2, len(bad))] = rng.integers(0, 256)
        try:
            out = strip_metadata(bytes(bad))
        except MetadataNotStripped:
            continue
        assert out.startswith(b"\xff\xd8") and out.endswith(b"\xff\xd9") and len(out) <= len(bad)
