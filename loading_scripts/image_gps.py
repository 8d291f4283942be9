"""Whether an image's bytes carry a GPS position, read from every metadata block of every frame
(`counterfactory show` flags such images).

PIL reads one EXIF, the first frame's first; a photo can hold its position elsewhere: in XMP
(`exif:GPSLatitude`, `Iptc4xmpExt:GPSLatitude`, a drone's `drone-dji:GpsLatitude`), in a second
EXIF, in an APP1 placed between a progressive file's scans, in a multi-picture file's (MPO) later
frames, or in a trailer after the last frame (a motion photo's video, with its `©xyz` atom). So
`gps_check` walks the file's own structure (`image_segments`, the walk `--strip-metadata` uses):

- JPEG: every frame in the file, and every application segment and comment of each, wherever it
  sits; the bytes between and after frames are read as one block too.
- PNG: every ancillary chunk, the compressed ones (zTXt, iTXt, iCCP) inflated, ImageMagick's hex
  "Raw profile type" text decoded; and the bytes after IEND.

In each block every EXIF (`Exif\\0\\0` + TIFF, or a PNG eXIf) is parsed: a GPS position is a GPS
IFD (tag 0x8825, CIPA DC-008) holding at least one entry, in any IFD the EXIF links. An XMP
property whose name holds GPS, Latitude or Longitude counts, in UTF-8 or UTF-16.

It errs towards "has GPS": a block that cannot be read (a cut segment, an EXIF whose IFDs point
outside it, a chunk that inflates past the bound) or a format other than JPEG and PNG gives
`GpsCheck.unread`, which callers flag as if a position were there, saying so.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass, field

from loading_scripts.image_segments import (
    APP1,
    APP2,
    PNG_SIGNATURE,
    MalformedImage,
    is_jpeg,
    jpeg_segments,
    png_chunks,
)

_GPS_IFD = 0x8825
#: IFD pointers an EXIF may link (the Exif and Interoperability IFDs, TIFF SubIFDs): a GPS IFD
#: pointer is looked for in every IFD reached, not only IFD0 where CIPA DC-008 puts it.
_SUB_IFDS = {0x8769, 0xA005, 0x014A}
_MAX_IFDS = 64
_MAX_INFLATED = 16 << 20
_EXIF = b"Exif\0\0"
_XMP_EXTENSION = b"http://ns.adobe.com/xmp/extension/\0"
_ICC = b"ICC_PROFILE\0"
_XMP_GPS = re.compile(rb"[<\s\"'][A-Za-z_][\w.-]*:[\w.-]*(?i:gps|latitude|longitude)[\w.-]*(?:\s*=|[\s/>])")
#: The QuickTime/MP4 location atom (ISO 6709) a motion photo's trailing video may hold.
_QUICKTIME_LOCATION = b"\xa9xyz"
_PIXEL_CHUNKS = {b"IHDR", b"PLTE", b"IDAT", b"IEND"}
_TEXT_CHUNKS = {b"tEXt", b"zTXt", b"iTXt", b"iCCP"}


@dataclass
class GpsCheck:
    """What `gps_check` found: `found` a GPS position; `unread` what could not be read (then a
    position may be there unseen)."""

    found: bool = False
    unread: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> bool:
        """Shown as carrying a GPS position: one was found, or the image could not be read fully."""
        return self.found or bool(self.unread)


def gps_check(data: bytes) -> GpsCheck:
    """Whether the image file `data` carries a GPS position (module docstring)."""
    check = GpsCheck()
    if is_jpeg(data):
        _jpeg(data, check)
    elif data.startswith(PNG_SIGNATURE):
        _png(data, check)
    else:
        check.unread.append("not a JPEG or PNG: its metadata is not read")
    return check


def _jpeg(data: bytes, check: GpsCheck) -> None:
    pos = 0
    while pos < len(data) and not check.found:
        if not is_jpeg(data, pos):  # between or after frames: not a frame, read as one block
            nxt = data.find(b"\xff\xd8\xff", pos + 1)
            end = nxt if nxt >= 0 else len(data)
            _block(data, pos, end, check)
            pos = end
            continue
        try:
            pos = _frame(data, pos, check)
        except MalformedImage as err:
            check.unread.append(str(err))
            _block(data, pos, len(data), check)  # what follows, read as one block
            return


def _frame(data: bytes, pos: int, check: GpsCheck) -> int:
    """Read the metadata segments of the frame at `pos`; where the frame ends."""
    icc, extended_xmp = bytearray(), bytearray()
    end = pos
    for seg in jpeg_segments(data, pos):
        end = seg.end
        if not seg.is_metadata():
            continue
        _block(data, seg.body, seg.body_end, check)
        if seg.marker == APP1 and data.startswith((b"II*\0", b"MM\0*"), seg.body):
            _exif(data, seg.body, seg.body_end, check)  # a TIFF without its "Exif" header
        # Parts of one profile or one XMP packet split over segments: read joined, too.
        if seg.marker == APP2 and data.startswith(_ICC, seg.body):
            icc += data[seg.body + len(_ICC) + 2 : seg.body_end]
        if seg.marker == APP1 and data.startswith(_XMP_EXTENSION, seg.body):
            extended_xmp += data[seg.body + len(_XMP_EXTENSION) + 40 : seg.body_end]
    for joined in (icc, extended_xmp):
        if joined:
            _block(joined, 0, len(joined), check)
    return end


def _png(data: bytes, check: GpsCheck) -> None:
    end = len(PNG_SIGNATURE)
    try:
        for chunk in png_chunks(data):
            end = chunk.end
            if chunk.kind in _PIXEL_CHUNKS:
                continue
            _block(data, chunk.body, chunk.body_end, check)
            if chunk.kind == b"eXIf":
                skip = len(_EXIF) if data.startswith(_EXIF, chunk.body) else 0
                _exif(data, chunk.body + skip, chunk.body_end, check)
            if chunk.kind in _TEXT_CHUNKS:
                text = _png_text(chunk.kind, data[chunk.body : chunk.body_end], check)
                if text:
                    _block(text, 0, len(text), check)
    except MalformedImage as err:
        check.unread.append(str(err))
    if end < len(data):
        _block(data, end, len(data), check)


def _png_text(kind: bytes, body: bytes, check: GpsCheck) -> bytes | None:
    """The text of a tEXt, zTXt, iTXt or iCCP chunk (`_TEXT_CHUNKS`), inflated when compressed,
    a "Raw profile type" text's hex decoded."""
    keyword, _, rest = body.partition(b"\0")
    if kind in (b"zTXt", b"iCCP"):
        text = _inflated(rest[1:], check)
    elif kind == b"iTXt" and rest[:1] == b"\1":
        text = _inflated(rest[2:].split(b"\0", 2)[-1], check)
    else:
        text = rest
    if text and keyword.startswith(b"Raw profile type"):
        try:  # "\n<name>\n<length>\n<hex lines>" (ImageMagick)
            return bytes.fromhex(text.split(b"\n", 3)[-1].decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            check.unread.append(f"a {keyword.decode('latin-1')!r} chunk is not hex")
    return text


def _inflated(compressed: bytes, check: GpsCheck) -> bytes | None:
    inflate = zlib.decompressobj()
    try:
        text = inflate.decompress(compressed, _MAX_INFLATED)
    except zlib.error as err:
        check.unread.append(f"a compressed PNG chunk cannot be inflated ({err})")
        return None
    if not inflate.eof:
        check.unread.append(f"a compressed PNG chunk inflates past {_MAX_INFLATED >> 20} MiB")
    return text


def _block(data: bytes | bytearray, start: int, end: int, check: GpsCheck) -> None:
    """Every EXIF and XMP property in `data[start:end]`."""
    if (
        _XMP_GPS.search(data, start, end)
        or data.find(_QUICKTIME_LOCATION, start, end) >= 0
        or _utf16_xmp_gps(data, start, end)
    ):
        check.found = True
    at, seen = data.find(_EXIF, start, end), 0
    while at >= 0 and not check.found:
        seen += 1
        if seen > _MAX_IFDS:
            check.unread.append(f"more than {_MAX_IFDS} EXIF headers in one block")
            return
        _exif(data, at + len(_EXIF), end, check)
        at = data.find(_EXIF, at + 1, end)


def _utf16_xmp_gps(data: bytes | bytearray, start: int, end: int) -> bool:
    """An XMP packet written in UTF-16 (allowed by the XMP spec) holding a GPS property."""
    at = data.find("xmpmeta".encode("utf-16-be"), start, end)
    if at < 0:
        at = data.find("xmpmeta".encode("utf-16-le"), start, end)
    return at >= 0 and bool(_XMP_GPS.search(data[start:end].replace(b"\0", b"")))


def _exif(data: bytes | bytearray, start: int, end: int, check: GpsCheck) -> None:
    """Whether the TIFF structure at `data[start:]` (within `end`) holds a GPS IFD with an entry."""
    try:
        check.found = check.found or _tiff_has_gps(data, start, end)
    except (MalformedImage, struct.error) as err:
        check.unread.append(f"an EXIF cannot be read ({err})")


def _tiff_has_gps(data: bytes | bytearray, start: int, end: int) -> bool:
    order = {b"II": "<", b"MM": ">"}.get(data[start : start + 2])
    if order is None or start + 8 > end or struct.unpack_from(order + "H", data, start + 2)[0] != 42:
        raise MalformedImage("no TIFF header")
    todo, seen = [struct.unpack_from(order + "I", data, start + 4)[0]], set()
    while todo:
        offset = todo.pop()
        if offset == 0 or offset in seen:
            continue
        if len(seen) >= _MAX_IFDS:
            raise MalformedImage(f"more than {_MAX_IFDS} IFDs")
        seen.add(offset)
        for tag, value in _ifd(data, start, end, offset, order, todo):
            if tag == _GPS_IFD and _ifd_size(data, start, end, value, order) > 0:
                return True
            if tag in _SUB_IFDS:
                todo.append(value)
    return False


def _ifd(
    data: bytes | bytearray, start: int, end: int, offset: int, order: str, todo: list[int]
) -> list[tuple[int, int]]:
    """The (tag, first value) entries of the IFD at `offset`; its next-IFD pointer goes on `todo`."""
    count = _ifd_size(data, start, end, offset, order)
    base = start + offset + 2
    if base + 12 * count + 4 > end:
        raise MalformedImage(f"an IFD at {offset} runs past the EXIF's end")
    entries = []
    for k in range(count):
        tag, kind, _, value = struct.unpack_from(order + "HHII", data, base + 12 * k)
        if kind == 3:  # a SHORT pointer sits in the value field's first two bytes
            value = struct.unpack_from(order + "H", data, base + 12 * k + 8)[0]
        entries.append((tag, value))
    todo.append(struct.unpack_from(order + "I", data, base + 12 * count)[0])
    return entries


def _ifd_size(data: bytes | bytearray, start: int, end: int, offset: int, order: str) -> int:
    if start + offset + 2 > end:
        raise MalformedImage(f"an IFD offset {offset} points past the EXIF's end")
    return struct.unpack_from(order + "H", data, start + offset)[0]
