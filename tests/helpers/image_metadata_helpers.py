"""Photos that carry metadata (issue 41): COCO fixture JPEGs re-saved with the EXIF a phone
writes (a camera, a GPS position) and a comment, and the checks of a stored image against its
source file made with PIL, the independent reader."""

from __future__ import annotations

import io
import json
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from PIL import Image, ImageCms

GPS_IFD = 0x8825


def add_gps(root: Path) -> dict[bytes, str]:
    """Every JPEG under `root` re-saved with a camera, a GPS position and a comment (the pixels
    are the file's as re-encoded); the new bytes -> file name."""
    files = {}
    for path in sorted(root.rglob("*.jpg")):
        with Image.open(path) as img:
            pixels = img.convert("RGB")
        ex = Image.Exif()
        ex[0x0110] = "PhoneCam 3"
        gps = ex.get_ifd(GPS_IFD)
        gps[1], gps[2] = "N", (52.0, 31.0, 12.0)
        buf = io.BytesIO()
        pixels.save(buf, "JPEG", quality=90, exif=ex, comment=b"at home")
        path.write_bytes(buf.getvalue())
        files[buf.getvalue()] = path.name
    return files


def assert_stripped_of(stored: bytes, source: bytes) -> None:
    """`stored` is `source` without its EXIF, GPS and comment: a JPEG of the same pixels."""
    before, after = Image.open(io.BytesIO(source)), Image.open(io.BytesIO(stored))
    assert before.getexif().get_ifd(GPS_IFD) and before.info.get("comment")  # the source carries them
    assert after.format == "JPEG" and dict(after.getexif()) == {} and "comment" not in after.info
    assert np.array_equal(np.asarray(after), np.asarray(before))


def stored(out: Path, key: str, column: str) -> dict[int, bytes]:
    """image id -> the stored bytes of `column`, read with pyarrow from the manifest's shards."""
    manifest = json.loads((out / "build_manifest.json").read_text())
    return {
        row["image_id"]: row[column]["bytes"]
        for shard in manifest["outputs"][key]["shards"]
        for row in pq.read_table(out / shard).to_pylist()
        if row[column] is not None
    }


# Hostile placements (issue 49): where a writer can hide a GPS position that a prefix rule keeps,
# or that a reader of PIL's first EXIF does not see. Each payload is PIL's EXIF with a GPS IFD
# plus an XMP packet naming a GPS position, so a byte scan finds either.

GPS_XMP = (
    b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
    b'<rdf:Description xmlns:xmp="http://ns.adobe.com/xap/1.0/" xmlns:exif="http://ns.adobe.com/exif/1.0/"'
    b' exif:GPSLatitude="52,31.2N" exif:GPSLongitude="13,24.3E"/></rdf:RDF></x:xmpmeta>'
)
#: What a stripped image must not hold anywhere in its bytes: an EXIF header, the XMP namespace,
#: "GPS", the GPS IFD pointer entry (tag 0x8825, LONG, count 1) in either byte order, the C2PA
#: chunk type, and the payload's latitude.
LEAK_MARKERS = (
    b"Exif\0\0",
    b"http://ns.adobe.com/xap",
    b"GPS",
    b"\x25\x88\x04\x00\x01\x00\x00\x00",
    b"\x88\x25\x00\x04\x00\x00\x00\x01",
    b"caBX",
    b"52,31.2N",
)


def gps_exif(camera: str = "PhoneCam 3", gps: bool = True) -> bytes:
    """PIL's EXIF block (b"Exif\\0\\0" + TIFF) with a camera and, with `gps`, a GPS position."""
    ex = Image.Exif()
    ex[0x0110] = camera
    if gps:
        ifd = ex.get_ifd(GPS_IFD)
        ifd[1], ifd[2] = "N", (52.0, 31.0, 12.0)
    return ex.tobytes()


def leaks(data: bytes) -> list[bytes]:
    """The LEAK_MARKERS found in `data`, or in the ICC profile PIL inflates from it (a PNG's)."""
    profile = Image.open(io.BytesIO(data)).info.get("icc_profile") or b""
    return [m for m in LEAK_MARKERS if m in data or m in profile]


def segment(marker: int, payload: bytes) -> bytes:
    """A JPEG marker segment."""
    return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload


def random_pixels(seed: int, size: int = 40) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size + 8, 3), dtype=np.uint8))


def jpeg_of(img: Image.Image, **save: object) -> bytes:
    """`img` as a JPEG with no metadata but PIL's JFIF APP0 (and `save`'s)."""
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, **save)
    return buf.getvalue()


def plain_jpeg(seed: int, **save: object) -> bytes:
    return jpeg_of(random_pixels(seed), **save)


def inserted(jpeg: bytes, *segments: bytes, replace_app0: bool = False) -> bytes:
    """`jpeg` with `segments` after its JFIF APP0 (in place of it with `replace_app0`)."""
    app0_end = 4 + struct.unpack(">H", jpeg[4:6])[0] if jpeg[2:4] == b"\xff\xe0" else 2
    return jpeg[: 2 if replace_app0 else app0_end] + b"".join(segments) + jpeg[app0_end:]


def after_first_scan(jpeg: bytes, *segments: bytes) -> bytes:
    """A progressive `jpeg` with `segments` placed between its first and second scan."""
    sos = jpeg.index(b"\xff\xda")
    second = jpeg.index(b"\xff\xda", sos + 2)
    tables = jpeg.rfind(b"\xff\xc4", sos, second)  # the tables the second scan reads, if any
    cut = tables if tables > 0 else second
    return jpeg[:cut] + b"".join(segments) + jpeg[cut:]


def jfif(thumbnail: bytes = b"") -> bytes:
    """A JFIF APP0 (72x96 dpi) carrying `thumbnail` as its RGB thumbnail (whole pixels, one row)."""
    pixels = thumbnail + bytes(-len(thumbnail) % 3)
    width, height = (len(pixels) // 3, 1) if pixels else (0, 0)
    assert width < 256, "a JFIF thumbnail row holds at most 255 pixels"
    return segment(0xE0, b"JFIF\0\x01\x01\x01\x00\x48\x00\x60" + bytes([width, height]) + pixels)


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_with_chunks(img: Image.Image, *chunks: bytes) -> bytes:
    """`img` as a PNG with `chunks` after IHDR."""
    buf = io.BytesIO()
    img.save(buf, "PNG")
    data = buf.getvalue()
    return data[:33] + b"".join(chunks) + data[33:]


def srgb_profile() -> bytes:
    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()


_PAYLOAD = gps_exif() + GPS_XMP
_ICC = b"ICC_PROFILE\0\x01\x01"
#: name -> the image made of some pixels that hides a GPS position where the prefix and deny-list
#: rules of issue 41 kept it (and, first and last but one, placements issue 41 already tested).
HIDDEN: dict[str, Callable[[Image.Image], bytes]] = {
    "app1-exif-xmp-comment-and-a-second-image": lambda img: inserted(
        jpeg_of(img),
        segment(0xE1, gps_exif()),
        segment(0xE1, b"http://ns.adobe.com/xap/1.0/\0" + GPS_XMP),
        segment(0xFE, GPS_XMP),
    )
    + jpeg_of(img, exif=gps_exif()),
    "jfif-thumbnail": lambda img: inserted(jpeg_of(img), jfif(_PAYLOAD), replace_app0=True),
    "jfxx-thumbnail-with-exif": lambda img: inserted(
        jpeg_of(img), segment(0xE0, b"JFXX\0\x10" + jpeg_of(img.resize((8, 8)), exif=gps_exif()))
    ),
    "icc-profile-then-gps": lambda img: inserted(jpeg_of(img), segment(0xE2, _ICC + srgb_profile() + _PAYLOAD)),
    "icc-segment-not-a-profile": lambda img: inserted(jpeg_of(img), segment(0xE2, _ICC + _PAYLOAD)),
    "adobe-longer-than-its-fields": lambda img: inserted(
        jpeg_of(img), segment(0xEE, b"Adobe\x00\x64\x00\x00\x00\x00\x01" + _PAYLOAD)
    ),
    "exif-between-scans": lambda img: after_first_scan(jpeg_of(img, progressive=True), segment(0xE1, gps_exif())),
    "png-cabx": lambda img: png_with_chunks(img, png_chunk(b"caBX", _PAYLOAD)),
    "png-private-chunk": lambda img: png_with_chunks(img, png_chunk(b"prVt", _PAYLOAD)),
    "png-iccp-then-gps": lambda img: png_with_chunks(
        img, png_chunk(b"iCCP", b"sRGB\0\0" + zlib.compress(srgb_profile() + _PAYLOAD))
    ),
}


def strip_variants(seed: int = 0) -> dict[str, bytes]:
    """Every HIDDEN placement, each in an image of random pixels."""
    return {name: hide(random_pixels(seed + k)) for k, (name, hide) in enumerate(HIDDEN.items())}


def hide_gps_in_jpegs(root: Path) -> dict[str, tuple[str, bytes]]:
    """Every JPEG under `root` re-saved with a GPS position in one of the JPEG placements of
    HIDDEN, in turn; file name -> (placement, the new bytes)."""
    jpeg_ways = [name for name in HIDDEN if not name.startswith("png-")]
    files = {}
    for k, path in enumerate(sorted(root.rglob("*.jpg"))):
        way = jpeg_ways[k % len(jpeg_ways)]
        with Image.open(path) as img:
            data = HIDDEN[way](img.convert("RGB"))
        path.write_bytes(data)
        files[path.name] = (way, data)
    return files


def mpo_with_gps_in_second_frame(seed: int = 0) -> bytes:
    """A two-frame MPO (PIL's writer) whose first frame carries no metadata and whose second
    carries an EXIF with a GPS position (its MP entry's size updated to match)."""
    rng = np.random.default_rng(seed)
    first, second = (Image.fromarray(rng.integers(0, 256, (32, 40, 3), dtype=np.uint8)) for _ in range(2))
    buf = io.BytesIO()
    first.save(buf, "MPO", save_all=True, append_images=[second])
    data = buf.getvalue()
    start = data.index(b"\xff\xd8\xff", 2)
    app1 = segment(0xE1, gps_exif())
    mpf = data.index(b"MPF\0")
    order = ">" if data[mpf + 4 : mpf + 6] == b"MM" else "<"
    old_size = struct.pack(order + "I", len(data) - start)
    size_at = data.index(old_size, mpf)
    data = data[:size_at] + struct.pack(order + "I", len(data) - start + len(app1)) + data[size_at + 4 :]
    return data[: start + 2] + app1 + data[start + 2 :]


def gps_hiding_places(seed: int = 0) -> dict[str, bytes]:
    """name -> a JPEG whose GPS position is where PIL's first EXIF of frame 0 does not reach."""
    return {
        "xmp-only": inserted(plain_jpeg(seed), segment(0xE1, b"http://ns.adobe.com/xap/1.0/\0" + GPS_XMP)),
        "second-mpo-frame": mpo_with_gps_in_second_frame(seed),
        "second-exif": inserted(plain_jpeg(seed), segment(0xE1, gps_exif(gps=False)), segment(0xE1, gps_exif())),
        "exif-between-scans": after_first_scan(plain_jpeg(seed, progressive=True), segment(0xE1, gps_exif())),
    }


def unreadable_exif(seed: int = 0) -> bytes:
    """A JPEG whose EXIF is cut inside its first IFD: a GPS IFD may be past the cut."""
    return inserted(plain_jpeg(seed), segment(0xE1, gps_exif()[:24]))
