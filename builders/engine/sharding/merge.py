"""Turn finished parts into the Hub layout: shards and the build manifest (the caller adds the card).

The manifest lists every data file written (`files`, see `build_files`). It is removed when a
merge starts and written last, so its presence marks a finished build (see `up_to_date`).

Shards are streamed part by part (never the whole split in memory) into
`data/[config/]split-NNNNN-of-NNNNN.parquet`; the shard count comes from the parts' total size so
each shard stays near `max_shard_bytes`. Each part is checked against the sha256, size and rows
its worker recorded before it is merged (`part_files`). New shards are written under temporary
names and renamed once every output's are written (a refused part leaves the previous merge
untouched), and shards of an earlier merge that the new set does not reuse are deleted afterwards.
Every shard, rename and deletion goes through the output root's descriptor (`OutputLayout.out`):
a linked `data/` (or a folder below it) is refused in one line before a shard is written.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Sequence

import pyarrow.parquet as pq

from builders import __version__
from builders.engine.errors import UserFacingError
from builders.engine.provenance import git_state, portable
from builders.engine.sharding.base import BuildInfo, OutputSpec
from builders.engine.sharding.build_files import FILES, file_record
from builders.engine.owned_files import remove_files, unowned
from builders.engine.sharding.build_records import add_pending, build_records, clear_pending
from builders.engine.sharding.layout import MANIFEST, OutputLayout
from builders.engine.sharding.part_files import PART_FILES, load_stats, part_tables
from builders.engine.sharding.part_writer import ROW_GROUP_ROWS, write_json
from builders.engine.sharding.up_to_date import invalidate

log = logging.getLogger(__name__)

#: Writes the card (and whatever it embeds) of a merged build, then its manifest:
#: `finish(layout, manifest, written_data_files)`.
Finisher = Callable[[OutputLayout, dict[str, Any], set[str]], None]

# Versions that decide the bytes of a build; recorded so a version can be rebuilt.
_RECORDED_PACKAGES = (
    "counterfactory",
    "torch",
    "datasets",
    "huggingface_hub",
    "pyarrow",
    "pillow",
    "numpy",
    "transformers",
    "diffusers",
    "sentence-transformers",
    "open_clip_torch",
    "nltk",
    "accelerate",
)


def package_versions() -> dict[str, str]:
    versions = {}
    for name in _RECORDED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def collect_stats(layout: OutputLayout, n_parts: int, keys: Sequence[str]) -> list[dict[str, Any]]:
    """Every part's stats (outputs `keys`), checked (`part_files.load_stats`); one line naming the
    first unfinished part."""
    stats = [load_stats(layout, k, keys) for k in range(n_parts)]
    missing = [k for k, s in enumerate(stats) if s is None]
    if missing:
        raise UserFacingError(
            f"{len(missing)} of {n_parts} parts are unfinished (first: part {missing[0]}, no "
            f"{layout.stats_file(missing[0])}); re-run the same command to finish them"
        )
    return [s for s in stats if s is not None]


@dataclass
class _Shards:
    """One output's shards, written under temporary names (renamed once every output is written)."""

    rows: int
    names: list[str]
    tmp: list[str]


def _write_output_shards(
    layout: OutputLayout,
    spec: OutputSpec,
    stats: Sequence[dict[str, Any]],
    max_shard_bytes: int,
    written_tmp: list[str],
) -> _Shards:
    """Stream the parts of `spec` into shards under temporary names (appended to `written_tmp` as
    they are created, for the caller to remove on failure). Each part is checked against its
    stats before a row of it is written (`part_tables`), so the sizes planned from the stats hold."""
    total_rows = sum(s["rows"][spec.key] for s in stats)
    if total_rows == 0:
        # datasets 5.2 cannot read a 0-row parquet file ("BatchSize must be greater than 0"), so
        # an empty output gets no shard and is left out of the card's `configs:`.
        log.warning("%s has no rows: it gets no shard and no entry in the card's configs", spec.key)
        return _Shards(0, [], [])
    total_bytes = sum(s[PART_FILES][spec.key]["bytes"] for s in stats if s["rows"][spec.key])
    n_shards = max(1, math.ceil(total_bytes / max_shard_bytes))
    rows_per_shard = max(1, math.ceil(total_rows / n_shards))
    n_shards = max(1, math.ceil(total_rows / rows_per_shard)) if total_rows else 1
    schema = spec.features.arrow_schema
    names = [layout.shard_name(spec.config, spec.split, i, n_shards) for i in range(n_shards)]
    start = len(written_tmp)

    shard, writer = 0, _ShardWriter(layout, names[0] + ".tmp", schema, written_tmp)
    room = rows_per_shard
    try:
        for k, part_stats in enumerate(stats):
            for table in part_tables(layout, spec, k, part_stats, ROW_GROUP_ROWS):
                while table.num_rows:
                    if room == 0:
                        writer.close()
                        shard += 1
                        writer = _ShardWriter(layout, names[shard] + ".tmp", schema, written_tmp)
                        room = rows_per_shard
                    take = table.slice(0, room)
                    writer.parquet.write_table(take, row_group_size=ROW_GROUP_ROWS)
                    room -= take.num_rows
                    table = table.slice(take.num_rows)
        writer.close()
    except BaseException:
        writer.close(failed=True)
        raise
    return _Shards(total_rows, names, written_tmp[start:])


class _ShardWriter:
    """A shard's parquet writer on a temporary file made relative to the output's descriptor
    (never through a linked `data/`), its name appended to `written_tmp` once it exists."""

    def __init__(self, layout: OutputLayout, rel: str, schema: Any, written_tmp: list[str]) -> None:
        self.file = layout.out.open(rel, "wb", create_folders=True)
        written_tmp.append(rel)
        self.parquet = pq.ParquetWriter(self.file, schema)

    def close(self, failed: bool = False) -> None:
        try:
            self.parquet.close()
            self.file.close()
        except OSError:
            if not failed:
                raise
            self.file.close()  # closing flushes, which fails the same way on a full disk


def _remove_stale_shards(layout: OutputLayout, keep: set[str]) -> None:
    """Delete the shards of an earlier merge that this one did not rewrite: those its records
    list unchanged (`build_records`); any other parquet file under `data/` is left in place and
    named (publish refuses the folder until the user moves it)."""
    out = layout.out
    if out.lstat("data") is None:
        return
    records = build_records(layout) or {}
    found = sorted((here / name).as_posix() for here, _, files, _ in out.walk("data") for name in files)
    stale = [rel for rel in found if rel.endswith(".parquet") and rel not in keep]
    for rel in stale:
        if unowned(out, [rel], records):
            log.warning("%s is not a shard this build recorded (or it changed): left in place", layout.root / rel)
        else:
            log.info("removing stale shard %s", rel)
            remove_files(out, [rel])


def _list_pending(layout: OutputLayout, shards: list[_Shards]) -> None:
    """List the new shards before they are renamed into place: a merge killed half-way leaves
    them the build's (`build_records`), for a later --overwrite to delete."""
    records = [
        {**file_record(layout.out, tmp), "path": name}
        for output in shards
        for tmp, name in zip(output.tmp, output.names, strict=True)
    ]
    add_pending(layout, records)


def _aggregate(stats: Sequence[dict[str, Any]], field: str) -> dict[str, int]:
    total: Counter[str] = Counter()
    for s in stats:
        total.update(s.get(field, {}))  # `counts` is absent from parts of older builds
    return dict(sorted(total.items()))


def peak_rss_summary(stats: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Peak resident memory of the processes that built the parts: the largest, each rank's
    (a rank's parts run in one process, so its largest part peak is the process's peak), and
    each part's. Parts of builds from before it was recorded count as unknown (None)."""
    per_part = [s.get("peak_rss_bytes") for s in stats]
    per_rank: dict[int, int] = {}
    for s, peak in zip(stats, per_part, strict=True):
        if peak is not None:
            per_rank[s["rank"]] = max(per_rank.get(s["rank"], 0), peak)
    return {
        "max": max(per_rank.values(), default=None),
        "per_rank": {str(rank): per_rank[rank] for rank in sorted(per_rank)},
        "per_part": per_part,
    }


def merge_parts(
    *,
    layout: OutputLayout,
    outputs: Sequence[OutputSpec],
    stats: Sequence[dict[str, Any]],
    n_items: int,
    info: BuildInfo,
    run_config: dict[str, Any],
    world_size: int,
    max_shard_bytes: int,
    finish: Finisher | None = None,
) -> dict[str, Any]:
    """Write the shards and the manifest; return the manifest.

    `finish` (the caller's: e.g. `publishing.card.write_card`) writes what the build publishes
    beside its shards, the card and its figures, and then the manifest (`record_files`, then
    `write_manifest` last), so the card is rendered from the manifest as published. Without it
    the build has no card.
    """
    shards = _write_all_shards(layout, outputs, stats, max_shard_bytes)
    invalidate(layout)  # until the new manifest is written, last, this is no finished build
    _list_pending(layout, list(shards.values()))
    outputs_manifest, keep = _put_shards_in_place(layout, outputs, shards)
    _remove_stale_shards(layout, keep)
    manifest = {
        **{k: v for k, v in asdict(info).items() if k != "local_inputs"},
        "counterfactory_version": __version__,
        "counterfactory_git": git_state(),
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "run": {**run_config, "processes": world_size, "parts": len(stats)},
        "packages": package_versions(),
        "items": n_items,
        "outputs": outputs_manifest,
        **_summed(stats),
    }
    # Published as is: model folders, sources and the tagger are named without local paths, and
    # every model (and local input) as the rows name it (`provenance.model_name`), however its
    # flag spelled it.
    manifest = portable(manifest, layout.root, inputs=[*info.models.values(), *info.local_inputs])
    if finish is None:
        record_files(layout, manifest, keep)
        write_manifest(layout, manifest)
    else:
        finish(layout, manifest, keep)
    return manifest


def _write_all_shards(
    layout: OutputLayout, outputs: Sequence[OutputSpec], stats: Sequence[dict[str, Any]], max_shard_bytes: int
) -> dict[str, Any]:
    """Every output's shards under temporary names (nothing renamed yet)."""
    written_tmp: list[str] = []
    try:
        return {spec.key: _write_output_shards(layout, spec, stats, max_shard_bytes, written_tmp) for spec in outputs}
    except BaseException:
        # A failed merge (disk full, a part that is not what its worker wrote) leaves no
        # half-written shard behind, and the previous merge as it was: nothing is renamed yet.
        for rel in written_tmp:
            layout.out.unlink(rel, missing_ok=True)
        raise


def _put_shards_in_place(
    layout: OutputLayout, outputs: Sequence[OutputSpec], shards: dict[str, Any]
) -> tuple[dict[str, Any], set[str]]:
    """Rename each output's shards to their names; return the manifest's `outputs` and the names."""
    outputs_manifest: dict[str, Any] = {}
    keep: set[str] = set()
    for spec in outputs:
        rows, names = shards[spec.key].rows, shards[spec.key].names
        for tmp, name in zip(shards[spec.key].tmp, names, strict=True):
            layout.out.replace(tmp, name)
        keep.update(names)
        outputs_manifest[spec.key] = {
            "config": spec.config,
            "split": spec.split,
            "rows": rows,
            "data_dir": layout.data_dir(spec.config),
            "shards": names,
            "bytes": sum(layout.out.lstat(name).st_size for name in names),
            "features": spec.features.to_dict(),
            **({"view": spec.view} if spec.view else {}),
        }
        log.info("%s: %d rows in %d shard(s)", spec.key, rows, len(names))
    return outputs_manifest, keep


def _summed(stats: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The parts' skips, errors, counts, timings and peak memory, summed over the parts."""
    return {
        "skipped": _aggregate(stats, "skipped"),
        "errors": _aggregate(stats, "errors"),
        "counts": _aggregate(stats, "counts"),
        "timings": {
            "process_s": round(sum(s["timings"]["process_s"] for s in stats), 3),
            "write_s": round(sum(s["timings"]["write_s"] for s in stats), 3),
        },
        "peak_rss_bytes": peak_rss_summary(stats),
    }


def record_files(layout: OutputLayout, manifest: dict[str, Any], written: set[str]) -> None:
    """Record the build's data files (`written`, relative paths) in the manifest.

    Every data file the merge and its finisher wrote, with size and digest: exactly what `publish`
    sends (with the card and this manifest) and what `--overwrite` deletes.
    """
    manifest[FILES] = [file_record(layout.out, rel) for rel in sorted(written)]


def write_manifest(layout: OutputLayout, manifest: dict[str, Any]) -> None:
    """Write the manifest: the last file of a merge, whose presence marks a finished build (a
    re-run with nothing to do relies on it: `up_to_date`). It lists the build's files from now on."""
    write_json(layout.out, MANIFEST, manifest)
    clear_pending(layout)
