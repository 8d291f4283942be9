"""The records of a build's files, and `--overwrite`'s discard of a build (`discard_build`).

A build folder's files are listed, with their size and sha256, by records of ours only:

- `build_manifest.json`: `files` (shards, card figures) and `card` (the README it rendered);
- `.parts/written.json`: files put in place before the manifest that lists them is written (a
  merge's new shards, a card, `renderings`' copies), and the files of a manifest `invalidate`
  removed. A merge killed half-way leaves its files listed there, so they stay the build's.

`--overwrite` (a build's, `renderings`') deletes exactly those files, the manifest, the `*.tmp`
files an interrupted write left and the work area `.parts/` (all but the lock the build holds),
after checking every other file (`owned_files`): a file no record lists, a listed file whose
content changed, a symlink, or a folder holding no build of ours (no manifest listing files, no
`.parts/written.json`, no `.parts/run.json`) is refused in one line, deleting nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

from builders.engine.errors import UserFacingError
from builders.engine.owned_files import refuse, remove_empty_folders, remove_files, unowned
from builders.engine.repo_paths import repo_path_problem
from builders.engine.sharding.build_files import CARD, FILES, folder_contents, is_bookkeeping, listed_paths
from builders.engine.sharding.layout import MANIFEST, PARTS_DIR, OutputLayout
from builders.engine.sharding.part_files import BookkeepingError, read_inside
from builders.engine.sharding.part_writer import write_json

#: The pending record, in `.parts/`.
PENDING = "written.json"
#: The manifest key recording the card's `{"bytes", "sha256"}`.
CARD_RECORD = "card"

Records = dict[str, dict[str, Any]]


def _read(layout: OutputLayout, path: Path) -> Any:
    """JSON of a regular file inside the folder (never through a link); None when it is not."""
    try:
        return json.loads(read_inside(layout.root, path))
    except (FileNotFoundError, NotADirectoryError, BookkeepingError, ValueError, RecursionError):
        return None


def manifest_records(layout: OutputLayout) -> Records | None:
    """The files the manifest lists (its card included); None when it is no manifest of ours."""
    manifest = _read(layout, layout.manifest)
    if not isinstance(manifest, dict):
        return None
    try:
        listed_paths(manifest, layout.root)
    except (UserFacingError, AttributeError):
        return None
    records = {entry["path"]: entry for entry in manifest[FILES]}
    card = manifest.get(CARD_RECORD)
    if isinstance(card, dict):
        records[CARD] = {**card, "path": CARD}
    return records


def _pending(layout: OutputLayout) -> Records | None:
    saved = _read(layout, layout.parts / PENDING)
    entries = saved.get(FILES) if isinstance(saved, dict) else None
    if not isinstance(entries, list):
        return None
    records = {}
    for entry in entries:
        path = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(path, str) and not repo_path_problem(path) and not is_bookkeeping(path):
            records[path] = entry
    return records


def build_records(layout: OutputLayout) -> Records | None:
    """Every file of the build our records list (by path); None when the folder holds no build of
    ours (an unfinished build with no file in place yet has `{}`)."""
    listed, pending = manifest_records(layout), _pending(layout)
    if listed is None and pending is None:
        fingerprint = _read(layout, layout.run_file)
        return {} if isinstance(fingerprint, dict) and "builder" in fingerprint else None
    return {**(listed or {}), **(pending or {})}


def add_pending(layout: OutputLayout, records: Iterable[dict[str, Any]]) -> None:
    """Record files about to be (or just) put in place, before the manifest that will list them."""
    merged = {**(_pending(layout) or {}), **{r["path"]: r for r in records}}
    write_json(layout.out, f"{PARTS_DIR}/{PENDING}", {FILES: list(merged.values())})


def carry_manifest(layout: OutputLayout) -> None:
    """Before the manifest is removed (`invalidate`): its files stay listed, as pending."""
    listed = manifest_records(layout)
    if listed:
        add_pending(layout, listed.values())


def clear_pending(layout: OutputLayout) -> None:
    """Once the manifest listing the build's files is written."""
    layout.out.unlink(f"{PARTS_DIR}/{PENDING}", missing_ok=True)


def write_card(layout: OutputLayout, manifest: dict[str, Any], card: str) -> None:
    """Write the card and record it in `manifest` (written next, by the caller); the files the
    manifest lists are pending first, so a kill before the manifest leaves them the build's."""
    data = card.encode()
    add_pending(layout, manifest[FILES])
    layout.out.write_atomic(CARD, data)
    manifest[CARD_RECORD] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    add_pending(layout, [{"path": CARD, **manifest[CARD_RECORD]}])


def check_discardable(layout: OutputLayout) -> list[str]:
    """The files `discard_build` deletes (relative paths, `.parts/` aside), after checking every
    one is the build's (module docstring); one line naming the others, or the folder, if not."""
    root = layout.root
    files, links = folder_contents(layout.out) if root.is_dir() else ([], [])
    records = build_records(layout)
    if records is None and (files or links):
        raise UserFacingError(
            f"--overwrite: {root} holds no build of counterfactory (no {MANIFEST} listing its files, "
            f"no .parts/run.json; found {(files or links)[0]}); nothing was deleted — choose an empty "
            "or new --output folder"
        )
    ours = manifest_records(layout) is not None
    checked = [p for p in files if not is_bookkeeping(p) and not (ours and p == MANIFEST)]
    found = [f"symlink {p}" for p in links] + unowned(layout.out, checked, records or {})
    refuse("--overwrite", root, found, MANIFEST)
    return files


def discard_build(layout: OutputLayout) -> None:
    """Delete the build in `layout` for `--overwrite` (`check_discardable` first: nothing is
    deleted unless every file is the build's), relative to the root's descriptor: a folder swapped
    for a link after the check is refused before any file is deleted (`owned_files.remove_files`).
    The lock this build holds stays."""
    out = layout.out
    remove_files(out, check_discardable(layout))
    if out.lstat(PARTS_DIR) is not None:
        _, dirs, files, links = next(out.walk(PARTS_DIR))
        remove_files(out, [f"{PARTS_DIR}/{name}" for name in files + links if name != layout.lock_file.name])
        for name in dirs:
            out.remove_tree(f"{PARTS_DIR}/{name}")
    remove_empty_folders(out)
