"""Writing one finished part: parquet per output, then the stats file.

Crash safety: each parquet file is written under a temporary name and renamed into place, and the
stats file, written last, is what marks the part finished. A kill at any point leaves either no
stats file (the part is redone on resume, overwriting any leftovers) or a complete part. A write
that fails (disk full) removes its temp file; one left by a kill is removed by the next run.

Each part file's sha256 and size (of the bytes written) go into its stats file, so the merge
merges exactly what the worker wrote (`part_files`). A temp file is created without following a
symlink: one planted under its name is refused, never written through.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
from datasets.table import embed_table_storage

# Small row groups keep readers' memory bounded for image rows (datasets uses 100 for images).
ROW_GROUP_ROWS = 100


def atomic_write_bytes(path: Path, data: bytes | memoryview) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with _removed_on_error(tmp):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)


def atomic_write_json(path: Path, obj: Any) -> None:
    # Insertion order, not sorted keys: the manifest's feature dicts carry the column order that
    # the card's `dataset_info` (and so a Hub load) reproduces.
    atomic_write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far, in bytes (recorded in each part's stats, so
    a build's per-process memory is known from its output)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB, macOS bytes


def rows_to_table(rows: list[dict[str, Any]], features: datasets.Features) -> pa.Table:
    """Encode rows (PIL images become embedded bytes) into a table with the HF schema metadata."""
    missing = [name for name in features if rows and name not in rows[0]]
    if missing:
        raise ValueError(f"builder rows lack columns {missing}; expected {list(features)}")
    encoded = [features.encode_example(row) for row in rows]
    table = pa.Table.from_pylist(encoded, schema=features.arrow_schema)
    # Rows may name image files instead of holding pixels; published shards must carry the bytes.
    return embed_table_storage(table)


def write_parquet(path: Path, table: pa.Table) -> dict[str, Any]:
    """Write a parquet file atomically (temp name + rename); return its `{"sha256", "bytes"}`.

    Encoded in memory first (a part's rows are in memory already), so the digest is that of the
    very bytes written."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=ROW_GROUP_ROWS)
    data = memoryview(sink.getvalue())
    atomic_write_bytes(path, data)
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": data.nbytes}


@contextmanager
def _removed_on_error(*tmp_files: Path) -> Iterator[None]:
    """A failed write (e.g. disk full) must not leave a half-written temp file taking space."""
    try:
        yield
    except BaseException:
        for tmp in tmp_files:
            tmp.unlink(missing_ok=True)
        raise
