"""Writing one finished part: parquet per output, then the stats file.

Crash safety: each parquet file is written under a temporary name and renamed into place, and the
stats file, written last, is what marks the part finished. A kill at any point leaves either no
stats file (the part is redone on resume, overwriting any leftovers) or a complete part. A write
that fails (disk full) removes its temp file; one left by a kill is removed by the next run.

Each part file's sha256 and size (of the bytes written) go into its stats file, so the merge
merges exactly what the worker wrote (`part_files`). Every file is written relative to the output
root's descriptor (`layout.OutputLayout.out`): a planted link, as the file or as any folder above
it, is refused, never written through.
"""

from __future__ import annotations

import hashlib
import json
import resource
import sys
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
from datasets.table import embed_table_storage

from builders.engine.no_follow import RootDir

# Small row groups keep readers' memory bounded for image rows (datasets uses 100 for images).
ROW_GROUP_ROWS = 100


def write_json(out: RootDir, rel: str, obj: Any) -> None:
    """Write `rel` (below the output root `out`) whole, via its `.tmp` sibling and a rename."""
    # Insertion order, not sorted keys: the manifest's feature dicts carry the column order that
    # the card's `dataset_info` (and so a Hub load) reproduces.
    out.write_atomic(rel, (json.dumps(obj, indent=2) + "\n").encode())


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


def write_parquet(out: RootDir, rel: str, table: pa.Table) -> dict[str, Any]:
    """Write a parquet file atomically (temp name + rename) below the output root `out`; return
    its `{"sha256", "bytes"}`.

    Encoded in memory first (a part's rows are in memory already), so the digest is that of the
    very bytes written."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=ROW_GROUP_ROWS)
    data = memoryview(sink.getvalue())
    out.write_atomic(rel, data)
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": data.nbytes}
