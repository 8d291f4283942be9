"""Reading a build's bookkeeping without trusting it: the parts and their stats files.

A finished part is a stats file (`.parts/stats/part-KKKKK.json`, written last) and, per output
with rows, a parquet file whose sha256, size and row count the stats file records. Whoever can
write to the output folder (a shared disk, a job array's scratch space) could plant or replace
these, so every reader here:

- opens them only as regular files inside the output, one path component at a time, without
  following a symlink (`read_inside`): a part or stats file linked to a file elsewhere is never
  read, nor is a FIFO or a device;
- checks a stats file's shape (`load_stats`) before any field is used;
- checks a part's bytes against its worker's record before its rows are merged (`part_tables`), so
  a part replaced, truncated or missing a row after it was written is refused by name, with the
  worker that built it (the stats' rank of world_size), instead of being merged and published.

Each part is read once into memory (hashed, then parsed from the same bytes): memory stays
bounded by a part, as when it was written.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from builders.engine.errors import UserFacingError
from builders.engine.sharding.base import OutputSpec
from builders.engine.no_follow import open_no_follow
from builders.engine.sharding.layout import OutputLayout

#: The stats key recording each part file's `{"sha256", "bytes"}`, by output (those with rows).
PART_FILES = "part_files"


class BookkeepingError(UserFacingError):
    """A part or stats file of the output is not what the build wrote: `path`, `problem`, `fix`."""

    def __init__(self, path: Path, problem: str, fix: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"{path} {problem}; {fix}")


def read_inside(root: Path, path: Path) -> bytes:
    """The bytes of `path`, a regular file under `root`, reached without following a symlink.

    The root itself may be a symlink (an output folder on another disk is the user's choice);
    every component below it must be a real folder, and the file a regular file. Raises
    FileNotFoundError when it does not exist, `BookkeepingError` when it is anything else.
    """
    fd = open_no_follow(root, path.relative_to(root), lambda: _not_regular(path))
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _not_regular(path: Path) -> BookkeepingError:
    return BookkeepingError(
        path,
        "is a symlink, is under one, or is not a regular file (the build's bookkeeping is never read through a link)",
        "remove it and re-run the build, which rebuilds what it held",
    )


def load_stats(layout: OutputLayout, part: int, keys: Sequence[str]) -> dict[str, Any] | None:
    """Part `part`'s stats (outputs `keys`), or None when it has none (not finished).

    Raises `BookkeepingError` naming the file when it is not a regular file inside the output or
    not a stats file of this build (garbage, `{}`, a field of the wrong type).
    """
    path = layout.stats_file(part)
    try:
        data = read_inside(layout.root, path)
    except FileNotFoundError:
        return None
    try:
        stats = json.loads(data)
    except (ValueError, RecursionError):
        stats = None
    problem = _stats_problem(stats, part, keys)
    if problem:
        raise BookkeepingError(
            path,
            f"is not a stats file of this build ({problem})",
            f"remove it and re-run the build (or the job-array worker of part {part}), which builds the part again",
        )
    assert isinstance(stats, dict)
    return stats


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_tally(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and _is_count(v) for k, v in value.items())


def _stats_problem(stats: Any, part: int, keys: Sequence[str]) -> str | None:
    """What is wrong with a parsed stats file of `part`, or None."""
    if not isinstance(stats, dict):
        return "not a JSON object"
    if stats.get("part") != part:
        return f"its `part` is {stats.get('part')!r}, not {part}"
    if not _is_count(stats.get("items")):
        return "no item count"
    rows = stats.get("rows")
    if not _is_tally(rows) or set(rows) != set(keys):
        return f"its `rows` do not name the outputs {sorted(keys)}"
    for field in ("skipped", "errors", "counts"):
        if not _is_tally(stats.get(field)):
            return f"its `{field}` is not a count per reason"
    digests = stats.get("item_digests")
    if not isinstance(digests, list) or len(digests) != stats["items"] or not all(isinstance(d, str) for d in digests):
        return "its `item_digests` do not match its item count"
    timings = stats.get("timings")
    if not isinstance(timings, dict) or not all(
        isinstance(timings.get(t), (int, float)) for t in ("process_s", "write_s")
    ):
        return "no timings"
    if not (
        _is_count(stats.get("rank")) and _is_count(stats.get("world_size")) and stats["rank"] < stats["world_size"]
    ):
        return "no rank of world_size"
    if stats.get("peak_rss_bytes") is not None and not _is_count(stats["peak_rss_bytes"]):
        return "its `peak_rss_bytes` is not a count"
    files = stats.get(PART_FILES)
    with_rows = {key for key in keys if rows[key]}
    if (
        not isinstance(files, dict)
        or set(files) != with_rows
        or not all(
            isinstance(f, dict) and isinstance(f.get("sha256"), str) and _is_count(f.get("bytes"))
            for f in files.values()
        )
    ):
        return f"its `{PART_FILES}` do not record the digest of each part file with rows"
    return None


def part_tables(
    layout: OutputLayout, spec: OutputSpec, part: int, stats: dict[str, Any], batch_rows: int
) -> Iterator[pa.Table]:
    """The rows of part `part` of output `spec`, `batch_rows` at a time in the output's schema,
    from a part checked against its stats (nothing when it has no rows)."""
    if not stats["rows"][spec.key]:
        return  # a file left there anyway is no part of the build, and is not read
    path = layout.part_file(spec.key, part)
    parquet = _read_part(layout, spec, part, stats, path)
    batches = parquet.iter_batches(batch_size=batch_rows)
    while True:
        try:
            batch = next(batches, None)
            if batch is None:
                return
            table = pa.Table.from_batches([batch]).cast(spec.features.arrow_schema)
        except pa.ArrowException as err:  # only a part planted with a matching stats file
            raise _part_error(path, f"does not decode as {spec.key} ({err})", part, stats) from None
        yield table


def _read_part(layout: OutputLayout, spec: OutputSpec, part: int, stats: dict[str, Any], path: Path) -> pq.ParquetFile:
    by = (
        f"part {part}, by worker {stats['rank']} of {stats['world_size']}, which recorded it "
        f"in {layout.stats_file(part)}"
    )
    try:
        data = read_inside(layout.root, path)
    except FileNotFoundError:
        raise _part_error(path, f"is missing ({by})", part, stats) from None
    except BookkeepingError as err:
        raise _part_error(path, f"{err.problem} ({by})", part, stats) from None
    record = stats[PART_FILES][spec.key]
    if len(data) != record["bytes"] or hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise _part_error(
            path,
            f"is not the file its worker wrote: its size or sha256 differs "
            f"from the record ({by}); it was replaced or damaged after it was "
            "written",
            part,
            stats,
        )
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as err:
        raise _part_error(path, f"is not a parquet file ({by}: {err})", part, stats) from None
    names, want = parquet.schema_arrow.names, list(spec.features)
    if names != want:
        extra, missing = sorted(set(names) - set(want)), sorted(set(want) - set(names))
        raise _part_error(
            path,
            f"has the columns {names}, not those of {spec.key} ({want}; extra: "
            f"{extra or 'none'}, missing: {missing or 'none'}; {by})",
            part,
            stats,
        )
    if parquet.metadata.num_rows != stats["rows"][spec.key]:
        raise _part_error(
            path,
            f"holds {parquet.metadata.num_rows} rows where its stats record {stats['rows'][spec.key]} ({by})",
            part,
            stats,
        )
    return parquet


def _part_error(path: Path, problem: str, part: int, stats: dict[str, Any]) -> BookkeepingError:
    worker = f"worker {stats['rank']} of --num-workers {stats['world_size']}"
    return BookkeepingError(
        path,
        problem,
        "nothing was merged — rebuild the part: remove its "
        f"stats file and re-run the build (in a job array: {worker}, then "
        "--merge-only)",
    )
