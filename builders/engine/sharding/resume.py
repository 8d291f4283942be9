"""Starting or resuming a build in an output folder: the run fingerprint, and whether the finished
parts were built from the inputs read now (see `inputs`).

`.parts/run.json` records what the build makes (builder, config, part size, outputs); a run of
another configuration is refused, or with `--overwrite` discards the old build. A finished part
whose recorded item digests differ from the current inputs is refused the same way, unless it is
redone anyway. A stats file that is not one the build wrote (`part_files.load_stats` refuses it)
counts as an unfinished part: it is built again from the inputs (see `finished_stats`).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Sequence

from builders.engine.errors import UserFacingError
from builders.engine.sharding.base import ShardedBuilder
from builders.engine.sharding.build_records import discard_build
from builders.engine.sharding.inputs import changed_items
from builders.engine.sharding.layout import OutputLayout
from builders.engine.sharding.part_files import BookkeepingError, load_stats, read_inside
from builders.engine.sharding.part_writer import write_json
from builders.engine.sharding.shares import ItemShare, PartCheck

log = logging.getLogger(__name__)


def fingerprint(builder: ShardedBuilder, part_size: int) -> dict[str, Any]:
    info = builder.info()
    return {
        "builder": info.builder,
        "config": info.config,
        "part_size": part_size,
        "outputs": {spec.key: spec.features.to_dict() for spec in builder.outputs()},
    }


def read_fingerprint(layout: OutputLayout) -> Any:
    """The recorded fingerprint; None when `run.json` is missing, not a regular file inside the
    folder, or not JSON (such a folder is no resumable build of any configuration)."""
    try:
        return json.loads(read_inside(layout.root, layout.run_file))
    except (FileNotFoundError, BookkeepingError, ValueError, RecursionError):
        return None


def finished_stats(layout: OutputLayout, part: int, keys: Sequence[str], warn: bool = True) -> dict[str, Any] | None:
    """Part `part`'s stats, or None when the part is to be built (again).

    A stats file that is not one this build wrote (garbage, `{}`, a symlink to another file) is
    taken for an unfinished part, as a missing one is: the part is rebuilt from the inputs and the
    file replaced (never written through). That loses nothing — the part's rows come from the
    inputs, not from that file — and the warning names the file; an error would only make the user
    delete it by hand to get the same. (`--merge-only`, which builds nothing, refuses it instead.)
    """
    try:
        return load_stats(layout, part, keys)
    except BookkeepingError as err:
        if warn:
            log.warning("%s %s: part %d is built again", err.path, err.problem, part)
        return None


def part_changes(layout: OutputLayout, keys: Sequence[str], retry_errors: bool) -> PartCheck:
    """A check for `share_items`: what differs between a finished part's recorded inputs and the
    current ones (nothing for a part not finished yet, or one that is redone anyway)."""

    def check(part: int, start: int, chunk: Sequence[Any]) -> list[str]:
        # Its owner warns about a stats file it rebuilds: this pass only compares.
        stats = finished_stats(layout, part, keys, warn=False)
        if stats is None or (retry_errors and stats["errors"]):
            return []
        return [f"part {part}: {c}" for c in changed_items(start, chunk, stats["item_digests"])]

    return check


def _prepare_output(layout: OutputLayout, fingerprint: dict[str, Any], overwrite: bool) -> bool:
    """Check or write the run fingerprint; False when a build of another config was discarded."""
    if os.path.lexists(layout.run_file):
        previous = read_fingerprint(layout)
        if previous == json.loads(json.dumps(fingerprint)):
            log.info("resuming the build in %s", layout.root)
            return True
        if not overwrite:
            what = (
                "a build made with a different configuration"
                if previous is not None
                else "a damaged build (its run.json is a link, not a regular file, or not JSON)"
            )
            raise UserFacingError(
                f"{layout.root} holds {what} ({layout.run_file}); use a new "
                "--output folder, or --overwrite to discard it"
            )
        log.warning("--overwrite: discarding the previous build in %s", layout.root)
        discard_build(layout)
        write_json(layout.out, layout.rel(layout.run_file), fingerprint)
        return False
    write_json(layout.out, layout.rel(layout.run_file), fingerprint)
    return True


def _changed_inputs(layout: OutputLayout, share: ItemShare) -> list[str]:
    """What differs between the current inputs and those finished parts were built from."""
    changed = list(share.problems)
    n_finished = len(list(layout.stats_file(0).parent.glob("part-*.json")))
    if n_finished > share.n_parts:
        changed.append(f"the inputs now give {share.n_parts} parts, {n_finished} were finished")
    return changed


def prepare_resume(layout: OutputLayout, fingerprint: dict[str, Any], share: ItemShare, overwrite: bool) -> None:
    """Start or resume the build in `layout` (main process, after the inputs were read with the
    `part_changes` check)."""
    if not _prepare_output(layout, fingerprint, overwrite):
        return  # a previous build of another configuration was discarded: nothing to compare
    changed = _changed_inputs(layout, share)
    if not changed:
        return
    if not overwrite:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise UserFacingError(
            f"the inputs of {layout.root} changed since its parts were built "
            f"({'; '.join(changed[:3])}{more}); restore the original inputs to resume, or rebuild "
            "from the current ones with --overwrite (or a new --output)"
        )
    log.warning("--overwrite: the inputs changed (%s); discarding the previous build", changed[0])
    discard_build(layout)
    write_json(layout.out, layout.rel(layout.run_file), fingerprint)
