"""The structure of a JPEG or PNG file, walked without decoding it: the one vocabulary that
`image_metadata.strip_metadata` (what is kept) and `image_gps.gps_check` (what is read for a GPS
position) share.

- JPEG (ITU-T T.81, annex B): a frame is SOI, marker segments, scans, EOI. `jpeg_segments` yields
  each marker segment of one frame where it sits, the ones between scans included (a progressive
  file's tables, or an APP1 a hostile writer placed there); a scan's entropy-coded data is part of
  its SOS segment. A multi-picture file (MPO, CIPA DC-007) holds further frames after the first
  EOI: the caller walks on from the returned end.
- PNG (ISO/IEC 15948): the signature, then chunks (length, type, data, CRC) up to IEND.

A structure that cannot be walked is `MalformedImage`, saying where; the bytes are never copied,
only sliced.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SOI, EOI, SOS, COM = 0xD8, 0xD9, 0xDA, 0xFE
APP0, APP1, APP2, APP14, APP15 = 0xE0, 0xE1, 0xE2, 0xEE, 0xEF
#: JPEG markers without a length (SOI, EOI, RST0-7, TEM).
_STANDALONE = {SOI, EOI, *range(0xD0, 0xD8), 0x01}


class MalformedImage(ValueError):
    """A JPEG or PNG whose structure cannot be walked; the message says where."""


class Segment(NamedTuple):
    """One JPEG marker segment: `data[start:end]` is the whole of it (for SOS, its entropy-coded
    data included); `data[body:body_end]` is its payload (after the marker and length)."""

    marker: int
    start: int
    body: int
    body_end: int
    end: int

    def is_metadata(self) -> bool:
        """An application segment (APPn) or a comment: where metadata lives."""
        return APP0 <= self.marker <= APP15 or self.marker == COM


class Chunk(NamedTuple):
    """One PNG chunk: `data[start:end]` is the whole chunk, `data[body:body_end]` its data."""

    kind: bytes
    start: int
    body: int
    body_end: int
    end: int


def is_jpeg(data: bytes, pos: int = 0) -> bool:
    return data.startswith(b"\xff\xd8", pos)


def jpeg_segments(data: bytes, pos: int = 0) -> Iterator[Segment]:
    """The segments of the JPEG frame that starts at `pos` (its SOI), SOI to EOI; the EOI
    segment's `end` is where the frame ends."""
    if not is_jpeg(data, pos):
        raise MalformedImage(f"no JPEG start-of-image marker at byte {pos}")
    n = len(data)
    while True:
        while pos + 1 < n and data[pos] == 0xFF and data[pos + 1] == 0xFF:
            pos += 1  # fill bytes before a marker
        if pos + 2 > n or data[pos] != 0xFF:
            raise MalformedImage(f"no JPEG marker at byte {pos}")
        marker = data[pos + 1]
        if marker in _STANDALONE:
            yield Segment(marker, pos, pos + 2, pos + 2, pos + 2)
            if marker == EOI:
                return
            pos += 2
            continue
        if pos + 4 > n:
            raise MalformedImage(f"a segment's length is cut off at byte {pos}")
        (length,) = struct.unpack_from(">H", data, pos + 2)
        body_end = pos + 2 + length
        if length < 2 or body_end > n:
            raise MalformedImage(f"a segment at byte {pos} runs past the end of the file")
        end = _scan_end(data, body_end) if marker == SOS else body_end
        yield Segment(marker, pos, pos + 4, body_end, end)
        pos = end


def _scan_end(data: bytes, pos: int) -> int:
    """Where a scan's entropy-coded data ends: at the first 0xFF that is not a stuffed byte
    (0xFF00), a restart marker (RST0-7) or a fill byte before one."""
    while True:
        pos = data.find(b"\xff", pos)
        if pos < 0 or pos + 1 >= len(data):
            raise MalformedImage("a scan runs to the end of the file without an end-of-image marker")
        following = data[pos + 1]
        if following == 0x00 or 0xD0 <= following <= 0xD7:
            pos += 2
            continue
        if following == 0xFF:
            pos += 1
            continue
        return pos


def png_chunks(data: bytes) -> Iterator[Chunk]:
    """The chunks of the PNG `data`, up to and including IEND (what follows is not the image)."""
    if not data.startswith(PNG_SIGNATURE):
        raise MalformedImage("no PNG signature")
    pos, n = len(PNG_SIGNATURE), len(data)
    while pos < n:
        if pos + 8 > n:
            raise MalformedImage(f"a PNG chunk header is cut off at byte {pos}")
        length, kind = struct.unpack_from(">I4s", data, pos)
        end = pos + 12 + length
        if end > n:
            raise MalformedImage(f"the PNG chunk at byte {pos} runs past the end of the file")
        yield Chunk(kind, pos, pos + 8, pos + 8 + length, end)
        if kind == b"IEND":
            return
        pos = end
    raise MalformedImage("the PNG has no IEND chunk")
