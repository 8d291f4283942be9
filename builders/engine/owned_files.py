"""Deleting or replacing a file in a folder the user named: only a file a record of ours lists.

The rule of every such site (the list is in `builders/engine/SECURITY.md`, "Deletion audit"): a
file may be deleted, or replaced by another, only when a manifest or record this project wrote
lists it with its current size and sha256. A file no record lists, a listed file whose content
changed (the user edited it), a symlink, or a folder that holds no build or run of ours is
refused in one line naming it, and nothing is deleted: every file is checked first, then the
files are deleted. A record is `{"path", "bytes", "sha256"}` (`build_files.file_record`).

Both the check and the deletion work relative to the folder's descriptor (`no_follow.RootDir`),
never through a symlinked folder below it: a linked folder is refused (`LinkRefused`), and
`remove_files` opens every folder it deletes in before deleting anything, so a folder swapped for a
link after the check is refused before the first file goes, or acted on where it was (issue #49).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Mapping

from builders.engine.errors import UserFacingError
from builders.engine.no_follow import RootDir, opened
from builders.engine.sharding.build_files import file_sha256
from builders.engine.sharding.layout import PARTS_DIR

Records = Mapping[str, Mapping[str, Any]]
_NAMED = 5  # how many offending paths one error line names


def matches(out: RootDir, rel: str, record: Mapping[str, Any]) -> bool:
    """Whether `rel` is a regular file (not a link) of the recorded size and sha256."""
    try:
        info = out.lstat(rel)
        if info is None or not stat.S_ISREG(info.st_mode):
            return False
        with out.open(rel, "rb") as fh:
            return os.fstat(fh.fileno()).st_size == record.get("bytes") and file_sha256(fh) == record.get("sha256")
    except (FileNotFoundError, NotADirectoryError):
        return False


def unowned(root: Path | RootDir, rels: Iterable[str], records: Records) -> list[str]:
    """The paths among `rels` (relative to `root`) that `records` does not list, or lists with
    another size or sha256, each as an error line names it. A path that is (or is under) a link is
    refused (`no_follow.LinkRefused`)."""
    if isinstance(root, Path) and not root.is_dir():
        return [f"{rel} (not listed)" for rel in rels if rel not in records]  # nothing there to check
    found = []
    with opened(root) as out:
        for rel in rels:
            if rel not in records:
                found.append(f"{rel} (not listed)")
            elif _exists(out, rel) and not matches(out, rel, records[rel]):
                found.append(f"{rel} (changed since it was written)")
    return found


def _exists(out: RootDir, rel: str) -> bool:
    try:
        return out.lstat(rel) is not None
    except NotADirectoryError:
        return False


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


def remove_files(out: RootDir, rels: Iterable[str]) -> None:
    """Delete the checked files `rels`: every folder they are in is opened first (a link among
    them refused before any file is deleted), then each file deleted in the folder opened."""
    folders: dict[PurePosixPath, int] = {}
    try:
        paths = [PurePosixPath(rel) for rel in rels]
        for path in paths:
            if path.parent not in folders:
                folders[path.parent] = out.folder(path.parent)
        for path in paths:
            try:
                os.unlink(path.name, dir_fd=folders[path.parent])
            except FileNotFoundError:
                pass  # a listed file that is gone is nothing to delete
    finally:
        for fd in folders.values():
            os.close(fd)


def remove_empty_folders(root: Path | RootDir) -> None:
    """Remove the folders under `root` left empty, deepest first (never `root` or `.parts/`)."""
    if isinstance(root, Path) and not root.is_dir():
        return
    with opened(root) as out:
        found = [
            (here, dirs, files, links)
            for here, dirs, files, links in out.walk()
            if not here.parts or here.parts[0] != PARTS_DIR
        ]
        emptied: set[PurePosixPath] = set()
        for here, dirs, files, links in reversed(found):
            if here.parts and not files and not links and all(here / d in emptied for d in dirs):
                out.rmdir(here)
                emptied.add(here)
