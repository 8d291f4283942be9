"""Dropping what a stored image carries besides its pixels, without re-encoding
(`--strip-metadata`).

Real images are stored as their file's bytes (`loading_scripts/images.py`), so a photo's EXIF,
its GPS position included, would be published unchanged. `strip_metadata` keeps, by an
allow-list, only what decoding and colour need, so "stripped" holds by construction: whatever
segment or chunk a writer invents is dropped, not passed.

- JPEG (the walk is `image_segments.jpeg_segments`): the first frame's SOI, frame and scan
  headers with their entropy-coded data, Huffman, arithmetic and quantisation tables, restart
  interval, DNL, DHP/EXP and EOI, byte for byte; and of the application segments only
  - a JFIF APP0, rewritten to its 14 fixed bytes with a 0x0 thumbnail (a JFIF thumbnail, or a
    JFXX extension APP0 holding a JPEG with its own EXIF, is dropped);
  - the APP2 `ICC_PROFILE` segments when, joined, they hold exactly one ICC profile and nothing
    else (`_only_a_profile`); otherwise all of them are dropped;
  - an Adobe APP14 cut to its 12 fixed bytes (the colour transform CMYK/YCCK decoding reads).
  Everything else goes: APP1 (Exif, XMP), APP13 (IPTC), APP2 FlashPix or MPF, any other APPn,
  COM, and the bytes after the first end-of-image marker (a multi-picture file's other frames).
  The EXIF Orientation goes with the EXIF: the stored pixels are the file's own, which is what
  the builders read and score.
- PNG: the critical chunks (IHDR, PLTE, IDAT, IEND) and the chunks that say how to read the
  samples' colours: tRNS, gAMA, cHRM, sRGB, cICP, sBIT, iCCP (checked as a JPEG's profile, its
  free-text name replaced by a fixed one), each at its fixed size. pHYs (9 fixed bytes, no room
  for anything else) is kept too: it holds the pixel aspect ratio a viewer needs to show
  non-square pixels undistorted. Everything else (tEXt, zTXt, iTXt, eXIf, tIME, caBX (C2PA),
  any private chunk) goes.
- Any other format cannot be rewritten here: `MetadataNotStripped`, which a builder counts.

`image_gps.gps_check` says whether an image carries a GPS position; `counterfactory show` flags
such images.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

from builders.engine.options import option
from loading_scripts.image_segments import (
    APP0,
    APP2,
    APP14,
    EOI,
    PNG_SIGNATURE,
    SOI,
    MalformedImage,
    Segment,
    is_jpeg,
    jpeg_segments,
    png_chunks,
)

#: The JPEG markers decoding reads (T.81 table B.1): SOF0-15 with DHT (C4) and DAC (CC) but not
#: the reserved JPG (C8); SOS, DQT, DNL, DRI, DHP, EXP; SOI and EOI.
_DECODING = {*range(0xC0, 0xD0), 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, SOI, EOI} - {0xC8}
_JFIF_FIXED = 14  # "JFIF\0", version, units, densities, thumbnail size
_ADOBE_FIXED = 12  # "Adobe", version, flags0, flags1, transform
_ICC_PREFIX = b"ICC_PROFILE\0"
#: PNG chunks kept -> the data lengths allowed (None: any).
_PNG_KEPT: dict[bytes, range | None] = {
    b"IHDR": range(13, 14),
    b"PLTE": range(3, 769, 3),
    b"IDAT": None,
    b"IEND": range(0, 1),
    b"tRNS": range(1, 257),
    b"gAMA": range(4, 5),
    b"cHRM": range(32, 33),
    b"sRGB": range(1, 2),
    b"cICP": range(4, 5),
    b"sBIT": range(1, 5),
    b"pHYs": range(9, 10),
}
_PNG_CRITICAL = {b"IHDR", b"PLTE", b"IDAT", b"IEND"}
#: An embedded profile larger than this is not kept (the largest real ones are a few MB).
_MAX_PROFILE = 16 << 20
#: The tags ICC.1 (v2 and v4) registers; a profile with any other (private) tag is not kept.
_ICC_TAGS = frozenset(
    tag.encode().ljust(4)
    for tag in (
        "A2B0 A2B1 A2B2 A2B3 B2A0 B2A1 B2A2 B2A3 B2D0 B2D1 B2D2 B2D3 D2B0 D2B1 D2B2 D2B3 bXYZ bTRC "
        "bkpt bfd calt chad chrm cicp ciis clro clrt clot cprt crdi desc devs dmnd dmdd gamt gXYZ "
        "gTRC kTRC lumi meas meta ncol ncl2 pre0 pre1 pre2 ps2s ps2i psd0 psd1 psd2 psd3 pseq psid "
        "resp rig0 rig2 rXYZ rTRC scrd scrn targ tech vued view wtpt"
    ).split()
)


class MetadataNotStripped(ValueError):
    """An image whose metadata `strip_metadata` cannot drop (another format, or a malformed
    segment structure); the message says why."""


def strip_metadata_option() -> Any:
    """The `--strip-metadata` field of a builder's config (`builders.engine.options`)."""
    return option(
        False,
        "drop the images' EXIF (with any GPS position), XMP and comments before storing them, "
        "losslessly: no re-encoding, identical pixels (default: stored byte for byte, metadata "
        "included; the card says which)",
        group="source images",
    )


def strip_metadata(data: bytes) -> bytes:
    """`data` (a JPEG or PNG file) with only what decoding needs (module docstring)."""
    try:
        if is_jpeg(data):
            return _strip_jpeg(data)
        if data.startswith(PNG_SIGNATURE):
            return _strip_png(data)
    except MalformedImage as err:
        raise MetadataNotStripped(str(err)) from None
    raise MetadataNotStripped("only JPEG and PNG metadata can be dropped without re-encoding")


def _strip_jpeg(data: bytes) -> bytes:
    keep_icc = _only_a_profile(_joined_icc(data))
    out = bytearray()
    for seg in jpeg_segments(data):
        out += _kept_segment(data, seg, keep_icc)
    return bytes(out)


def _kept_segment(data: bytes, seg: Segment, keep_icc: bool) -> bytes:
    """What of `seg` the stripped JPEG holds: all of it, its fixed fields, or nothing."""
    body = data[seg.body : seg.body_end] if seg.is_metadata() else b""
    if seg.marker in _DECODING:
        return data[seg.start : seg.end]
    if seg.marker == APP0 and body.startswith(b"JFIF\0") and len(body) >= _JFIF_FIXED:
        return b"\xff\xe0" + struct.pack(">H", _JFIF_FIXED + 2) + body[: _JFIF_FIXED - 2] + b"\0\0"
    if seg.marker == APP2 and keep_icc and body.startswith(_ICC_PREFIX):
        return data[seg.start : seg.end]
    if seg.marker == APP14 and body.startswith(b"Adobe") and len(body) >= _ADOBE_FIXED:
        return b"\xff\xee" + struct.pack(">H", _ADOBE_FIXED + 2) + body[:_ADOBE_FIXED]
    return b""


def _joined_icc(data: bytes) -> bytes | None:
    """The ICC profile the first frame's APP2 `ICC_PROFILE` segments hold, joined in their
    sequence numbers' order; None when there is none or the chunks are not one numbered whole."""
    chunks: dict[int, bytes] = {}
    counts = set()
    for seg in jpeg_segments(data):
        if seg.marker == APP2 and data.startswith(_ICC_PREFIX, seg.body):
            head = seg.body + len(_ICC_PREFIX)
            if head + 2 > seg.body_end or data[head] in chunks or len(chunks) >= 255:
                return None
            chunks[data[head]] = data[head + 2 : seg.body_end]
            counts.add(data[head + 1])
    if not chunks or counts != {len(chunks)} or set(chunks) != set(range(1, len(chunks) + 1)):
        return None
    return b"".join(chunks[k] for k in sorted(chunks))


def _only_a_profile(profile: bytes | None) -> bool:
    """Whether `profile` is an ICC profile (ICC.1 section 7) and nothing else: the size its header
    declares, the `acsp` signature, zero reserved bytes, only registered tags, and no byte outside
    the header, the tag table and the tags' data but the zero padding that aligns them."""
    if profile is None or len(profile) < 132 or len(profile) > _MAX_PROFILE:
        return False
    size, count = struct.unpack_from(">I", profile)[0], struct.unpack_from(">I", profile, 128)[0]
    table_end = 132 + 12 * count
    if size != len(profile) or profile[36:40] != b"acsp" or any(profile[100:128]) or table_end > size:
        return False
    spans = [(0, table_end)]
    for k in range(count):
        tag, offset, length = struct.unpack_from(">4sII", profile, 132 + 12 * k)
        if tag not in _ICC_TAGS or offset < table_end or offset + length > size:
            return False
        spans.append((offset, offset + length))
    covered = 0
    for start, end in sorted(spans) + [(size, size)]:
        if start > covered and (start - covered > 3 or any(profile[covered:start])):
            return False  # bytes that are no part of the profile's structure
        covered = max(covered, end)
    return True


def _strip_png(data: bytes) -> bytes:
    out = bytearray(PNG_SIGNATURE)
    for chunk in png_chunks(data):
        length = chunk.body_end - chunk.body
        allowed = _PNG_KEPT.get(chunk.kind, ())
        if chunk.kind == b"iCCP":
            out += _kept_iccp(data[chunk.body : chunk.body_end])
        elif allowed is None or length in allowed:
            out += data[chunk.start : chunk.end]
        elif chunk.kind in _PNG_CRITICAL:
            raise MetadataNotStripped(f"the PNG's {chunk.kind.decode('latin-1')} chunk has {length} bytes of data")
    return bytes(out)


def _kept_iccp(body: bytes) -> bytes:
    """An iCCP chunk holding its profile under a fixed name when the profile is only a profile
    (`_only_a_profile`), else nothing."""
    name_end = body.find(b"\0", 0, 80)
    if name_end < 1 or body[name_end + 1 : name_end + 2] != b"\0":  # compression method 0 (zlib)
        return b""
    compressed = body[name_end + 2 :]
    inflate = zlib.decompressobj()
    try:
        profile = inflate.decompress(compressed, _MAX_PROFILE + 1)
    except zlib.error:
        return b""
    if not inflate.eof or inflate.unused_data or not _only_a_profile(profile):
        return b""
    data = b"iCCP" + b"ICC profile\0\0" + compressed
    return struct.pack(">I", len(data) - 4) + data + struct.pack(">I", zlib.crc32(data))
