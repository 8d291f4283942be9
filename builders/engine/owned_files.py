"""Deleting or replacing a file in a folder the user named: only a file a record of ours lists.

The rule of every such site (the list is in `builders/engine/SECURITY.md`, "Deletion audit"): a
file may be deleted, or replaced by another, only when a manifest or record this project wrote
lists it with its current size and sha256. A file no record lists, a listed file whose content
changed (the user edited it), a symlink, or a folder that holds no build or run of ours is
refused in one line naming it, and nothing is deleted: every file is checked first, then the
files are deleted. A record is `{"path", "bytes", "sha256"}` (`build_files.file_record`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Iterable, Mapping

from builders.engine.errors import UserFacingError
from builders.engine.sharding.build_files import file_sha256
from builders.engine.sharding.layout import PARTS_DIR

Records = Mapping[str, Mapping[str, Any]]
_NAMED = 5  # how many offending paths one error line names


def matches(path: Path, record: Mapping[str, Any]) -> bool:
    """Whether `path` is a regular file (not a link) of the recorded size and sha256."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return (
        stat.S_ISREG(info.st_mode)
        and info.st_size == record.get("bytes")
        and file_sha256(path) == record.get("sha256")
    )


def unowned(root: Path, rels: Iterable[str], records: Records) -> list[str]:
    """The paths among `rels` (relative to `root`) that `records` does not list, or lists with
    another size or sha256, each as an error line names it."""
    found = []
    for rel in rels:
        if rel not in records:
            found.append(f"{rel} (not listed)")
        elif os.path.lexists(root / rel) and not matches(root / rel, records[rel]):
            found.append(f"{rel} (changed since it was written)")
    return found


def refuse(flag: str, root: Path, found: list[str], record: str) -> None:
    """One line naming the files `found` (`unowned`'s, or `symlink X`), when there are any."""
    if not found:
        return
    more = f" and {len(found) - _NAMED} more" if len(found) > _NAMED else ""
    raise UserFacingError(
        f"{flag}: {root} holds {len(found)} file(s) that {record} does not list with their current "
        f"sha256: {', '.join(found[:_NAMED])}{more}; nothing was deleted — move them out of the "
        "folder (or delete them yourself), then re-run"
    )


def remove_empty_folders(root: Path) -> None:
    """Remove the folders under `root` left empty, deepest first (never `root` or `.parts/`)."""
    for dirpath, _, _ in sorted(os.walk(root), key=lambda w: -len(w[0])):
        here = Path(dirpath)
        if here != root and PARTS_DIR not in here.relative_to(root).parts and not any(here.iterdir()):
            here.rmdir()
