"""Photos that carry metadata (issue 41): COCO fixture JPEGs re-saved with the EXIF a phone
writes (a camera, a GPS position) and a comment, and the checks of a stored image against its
source file made with PIL, the independent reader."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from PIL import Image

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
