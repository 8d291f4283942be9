"""What a stored image carries besides its pixels, and dropping it without re-encoding
(`--strip-metadata`).

Real images are stored as their file's bytes (`loading_scripts/images.py`), so a photo's EXIF,
its GPS position included, would be published unchanged. `strip_metadata` rewrites the file's
metadata segments away and copies everything that makes the pixels byte for byte:

- JPEG: the marker segments before and between the scans are walked; APP0 (JFIF), APP14 (Adobe:
  how to read the colour transform) and the APP2 `ICC_PROFILE` segments (the colours' meaning:
  dropping it would change how the image displays; it names a colour space, not a person or a
  place) are kept, as is every segment that decoding needs (tables, frame and scan headers,
  restart intervals). Every other APPn (APP1 Exif and XMP, APP13 Photoshop/IPTC, APP2 FlashPix or
  MPF, ...) and COM (comments) are dropped. The entropy-coded data is copied as it is; bytes after
  the end-of-image marker (a multi-picture file's second image, with its own EXIF) are dropped.
  The EXIF Orientation goes with the EXIF: the stored pixels are the file's own, which is what the
  builders read and score (`loading_scripts/images.py`).
- PNG: the chunks that carry text or metadata (`tEXt`, `zTXt`, `iTXt`, `eXIf`, `tIME`) are
  dropped; every other chunk (pixels, palette, transparency, colour: `iCCP`, `gAMA`, ...) is kept.
- Any other format cannot be rewritten here: `MetadataNotStripped`, which a builder counts.

`image_gps.gps_check` says whether an image carries a GPS position; `counterfactory show` flags
such images.
"""

from __future__ import annotations

import struct
from typing import Any

from builders.engine.options import option

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_METADATA_CHUNKS = {b"tEXt", b"zTXt", b"iTXt", b"eXIf", b"tIME"}
#: JPEG markers without a length (SOI, EOI, RST0-7, TEM).
_STANDALONE = {0xD8, 0xD9, *range(0xD0, 0xD8), 0x01}
_APP0, _APP2, _APP14, _COM = 0xE0, 0xE2, 0xEE, 0xFE


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
    """`data` (a JPEG or PNG file) without its metadata (module docstring)."""
    if data.startswith(b"\xff\xd8"):
        return _strip_jpeg(data)
    if data.startswith(_PNG_SIGNATURE):
        return _strip_png(data)
    raise MetadataNotStripped("only JPEG and PNG metadata can be dropped without re-encoding")


def _kept_jpeg_segment(marker: int, payload: bytes) -> bool:
    if marker == _COM:
        return False
    if _APP0 <= marker <= 0xEF:
        return (
            (marker == _APP0 and payload.startswith((b"JFIF\0", b"JFXX\0")))
            or (marker == _APP14 and payload.startswith(b"Adobe"))
            or (marker == _APP2 and payload.startswith(b"ICC_PROFILE\0"))
        )
    return True


def _strip_jpeg(data: bytes) -> bytes:
    out = bytearray(b"\xff\xd8")
    pos, n = 2, len(data)
    while True:
        while pos < n and data[pos] == 0xFF and pos + 1 < n and data[pos + 1] == 0xFF:
            pos += 1  # fill bytes before a marker
        if pos + 2 > n or data[pos] != 0xFF:
            raise MetadataNotStripped(f"no JPEG marker at byte {pos}")
        marker = data[pos + 1]
        if marker == 0xD9:  # end of image: what follows is not this image
            out += b"\xff\xd9"
            return bytes(out)
        if marker in _STANDALONE:
            out += data[pos : pos + 2]
            pos += 2
            continue
        if pos + 4 > n:
            raise MetadataNotStripped(f"a segment's length is cut off at byte {pos}")
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        end = pos + 2 + length
        if length < 2 or end > n:
            raise MetadataNotStripped(f"a segment at byte {pos} runs past the end of the file")
        if _kept_jpeg_segment(marker, data[pos + 4 : end]):
            out += data[pos:end]
        pos = end
        if marker == 0xDA:  # start of scan: entropy-coded data up to the next real marker
            scan_end = _scan_end(data, pos)
            out += data[pos:scan_end]
            pos = scan_end


def _scan_end(data: bytes, pos: int) -> int:
    """Where a scan's entropy-coded data ends: at the first 0xFF that is not a stuffed byte
    (0xFF00) or a restart marker (RST0-7)."""
    while True:
        pos = data.find(b"\xff", pos)
        if pos < 0 or pos + 1 >= len(data):
            raise MetadataNotStripped("a scan runs to the end of the file without an end-of-image marker")
        following = data[pos + 1]
        if following == 0x00 or 0xD0 <= following <= 0xD7:
            pos += 2
            continue
        return pos


def _strip_png(data: bytes) -> bytes:
    out = bytearray(_PNG_SIGNATURE)
    pos = len(_PNG_SIGNATURE)
    while pos < len(data):
        if pos + 8 > len(data):
            raise MetadataNotStripped(f"a PNG chunk header is cut off at byte {pos}")
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        end = pos + 12 + length
        if end > len(data):
            raise MetadataNotStripped(f"the PNG chunk at byte {pos} runs past the end of the file")
        if kind not in _PNG_METADATA_CHUNKS:
            out += data[pos:end]
        pos = end
        if kind == b"IEND":
            return bytes(out)
    raise MetadataNotStripped("the PNG has no IEND chunk")
