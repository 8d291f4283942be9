"""Whether a build folder already holds the finished build a run would make: then the re-run has
nothing to do and returns at once, without reading its inputs, rewriting a shard or redrawing a
figure, in a time that does not grow with the output's size (no file is read but the manifest).

Why sizes and mtimes suffice, without hashing every shard: `build_manifest.json` is written last
(atomically, after every shard, figure and the card) and removed (`invalidate`) before any part is
built or any shard written. So a manifest that exists belongs to a merge that finished, and
nothing this project writes has changed the build since. What is left is a change made by hand;
it is caught when it changes a file's size, removes a file, or touches one after the merge (an
mtime later than the manifest's). An in-place same-size edit that keeps an old mtime is not: that
is a deliberate forgery, and `counterfactory publish` checks every sha256 anyway.

Changed *inputs* are not noticed either, since they are not re-read: the finished build is a
consistent build of the inputs it was made from, and `--overwrite` (which always re-reads them)
rebuilds from changed ones, as a resume on changed inputs already required.
"""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path
from typing import Any

from builders import __version__
from builders.engine.errors import UserFacingError
from builders.engine.sharding.build_files import FILES, listed_paths
from builders.engine.sharding.build_records import carry_manifest
from builders.engine.sharding.layout import MANIFEST, OutputLayout
from builders.engine.sharding.part_files import read_inside

log = logging.getLogger(__name__)


def invalidate(layout: OutputLayout) -> None:
    """Remove the manifest before a part or shard is (re)written: until the merge writes it again,
    the folder is not a finished build (for a re-run, and for `publish`). The files it listed stay
    listed, as pending (`build_records`)."""
    carry_manifest(layout)
    layout.out.unlink(MANIFEST, missing_ok=True)


def finished_manifest(
    layout: OutputLayout, fingerprint: dict[str, Any], max_shard_bytes: int, retry_errors: bool, with_card: bool
) -> dict[str, Any] | None:
    """The manifest of the finished build in `layout` when a run with these settings would make
    exactly it again, else None (and the reason at DEBUG level)."""
    try:
        reason = _difference(layout, fingerprint, max_shard_bytes, retry_errors, with_card)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, UserFacingError) as err:
        reason = f"unreadable bookkeeping ({err})"  # a damaged manifest: the merge rewrites it
    if reason:
        log.debug("%s needs the merge: %s", layout.root, reason)
        return None
    return _read_json(layout, layout.manifest)


def _read_json(layout: OutputLayout, path: Path) -> Any:
    # Never through a symlink: a planted link is "not a finished build", and the merge replaces it.
    return json.loads(read_inside(layout.root, path))


def _difference(
    layout: OutputLayout, fingerprint: dict[str, Any], max_shard_bytes: int, retry_errors: bool, with_card: bool
) -> str | None:
    if not layout.manifest.is_file() or not layout.run_file.is_file():
        return "no finished merge"
    if _read_json(layout, layout.run_file) != json.loads(json.dumps(fingerprint)):
        return "another configuration"  # the ordinary path refuses it or --overwrite discards it
    manifest = _read_json(layout, layout.manifest)
    run = manifest["run"]
    if manifest.get("counterfactory_version") != __version__:
        return "made by another counterfactory version"
    if run["max_shard_bytes"] != max_shard_bytes:
        return "another --max-shard-bytes"
    if retry_errors and manifest["errors"]:
        return "--retry-errors and parts that recorded errors"
    stats_dir = layout.stats_file(0).parent
    names = sorted(p.name for p in stats_dir.glob("part-*.json")) if stats_dir.is_dir() else []
    if names != [layout.stats_file(k).name for k in range(run["parts"])]:
        return "the finished parts are not those the manifest was merged from"
    merged_ns = layout.manifest.stat().st_mtime_ns
    records = {entry["path"]: entry for entry in manifest[FILES]}
    for rel in listed_paths(manifest, layout.root):
        try:
            info = (layout.root / rel).lstat()
        except FileNotFoundError:
            return f"{rel} is missing"
        if not stat.S_ISREG(info.st_mode) or info.st_size != records[rel]["bytes"]:
            return f"{rel} is not the file the merge wrote"
        if info.st_mtime_ns > merged_ns:
            return f"{rel} changed after the merge"
    if with_card and (not layout.readme.is_file() or layout.readme.stat().st_mtime_ns > merged_ns):
        return "no card, or one changed after the merge"
    return None
