"""Which files make up a build, and what else a build folder may hold.

The merge records every data file it wrote (shards, card figures) in `build_manifest.json` under
`files`, with its size and sha256. Those files, the card (`README.md`) and the manifest itself are
the whole build: `publish` sends exactly them, after checking each is a regular file inside the
folder with the recorded size and digest, and `--overwrite` deletes exactly the old build
(`build_records`, which also records the card and files put in place before the manifest).

Beside them a build folder holds only the build's bookkeeping (`.parts/`, and `*.tmp` files an
interrupted write left, which the next run removes). Anything else — a symlink (to a secret or
not), a dotfile such as `.env`, a stray file — is never published and never deleted: both refuse
with one line naming it, so the user decides what it is.
"""

from __future__ import annotations

import hashlib
import os
import stat
from contextlib import nullcontext
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Iterator

from builders.engine.errors import UserFacingError
from builders.engine.no_follow import RootDir, opened
from builders.engine.repo_paths import repo_path_problem
from builders.engine.sharding.layout import MANIFEST, PARTS_DIR

#: The manifest key listing the build's data files.
FILES = "files"
#: Written by the merge itself, beside the listed data files.
CARD = "README.md"
_NAMED = 5  # how many offending paths one error line names


def read_chunks(source: Path | BinaryIO, size: int = 8 << 20) -> Iterator[bytes]:
    """The bytes of a file (a path, or a file object opened by the caller, read from where it is)."""
    with open(source, "rb") if isinstance(source, Path) else nullcontext(source) as fh:
        while chunk := fh.read(size):
            yield chunk


def file_sha256(source: Path | BinaryIO) -> str:
    """Hex sha256 of a file (a path, or an opened file object), read in chunks (a shard may be GBs)."""
    digest = hashlib.sha256()
    for chunk in read_chunks(source):
        digest.update(chunk)
    return digest.hexdigest()


def file_record(root: Path | RootDir, rel: str) -> dict[str, Any]:
    """`{"path", "bytes", "sha256"}` of one file of the build (relative POSIX path), read through
    the root's descriptor (never through a link below it)."""
    with opened(root) as out, out.open(rel, "rb") as fh:
        return {"path": rel, "bytes": os.fstat(fh.fileno()).st_size, "sha256": file_sha256(fh)}


def is_bookkeeping(rel: str) -> bool:
    """The build's own work area and leftovers, never published (see `output_guard`)."""
    first = rel.split("/", 1)[0]
    return first == PARTS_DIR or (rel.endswith(".tmp") and ("/" not in rel or first == "data"))


def folder_contents(root: Path | RootDir) -> tuple[list[str], list[str]]:
    """(files, symlinks) under `root` but outside `.parts/`, as relative paths; links not followed
    (listed relative to the root's descriptor: `no_follow.RootDir.walk`)."""
    files: list[str] = []
    links: list[str] = []
    if isinstance(root, Path) and not root.is_dir():
        return files, links
    with opened(root) as out:
        for here, dirs, names, linked in out.walk():
            if here == PurePosixPath():
                dirs[:] = [d for d in dirs if d != PARTS_DIR]  # pruned in place: fwalk skips it
            dirs.sort()
            files += [(here / name).as_posix() for name in sorted(names)]
            links += [(here / name).as_posix() for name in sorted(linked)]
    return files, links


def listed_paths(manifest: dict[str, Any], where: Path) -> list[str]:
    """The data files a manifest lists (checked to be plain relative paths inside the build)."""
    if not isinstance(manifest.get(FILES), list):
        raise UserFacingError(
            f"{where / MANIFEST} lists no files (a build made before counterfactory recorded them); "
            "re-run the build command once (finished parts are kept) to record them"
        )
    paths = []
    for entry in manifest[FILES]:
        path = entry.get("path") if isinstance(entry, dict) else None
        problem = repo_path_problem(path) if isinstance(path, str) else "not a path"
        if not problem and (path in (CARD, MANIFEST) or is_bookkeeping(path)):
            problem = "not a data file of the build"
        if problem:
            raise UserFacingError(
                f"{where / MANIFEST} lists {path!r} as a file of the build "
                f"({problem}); the manifest was edited or damaged — re-run the "
                "build command"
            )
        paths.append(path)
    return paths


def _names(paths: list[str]) -> str:
    more = f" and {len(paths) - _NAMED} more" if len(paths) > _NAMED else ""
    return ", ".join(paths[:_NAMED]) + more


def check_published_files(root: Path, manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each listed data file's manifest record (by path), after checking the folder holds nothing else.

    Raises one line naming every symlink and unlisted file of the folder, or the first listed file
    that is missing, not a regular file inside the folder, or of another size. The caller, which
    reads the bytes anyway, compares the sha256 (`changed_since_build`).
    """
    root = root.resolve()
    listed = listed_paths(manifest, root)
    files, links = folder_contents(root)
    own = set(listed) | {CARD, MANIFEST}
    strays = [p for p in files if p not in own and not is_bookkeeping(p)]
    if links or strays:
        found = [f"symlink {p}" for p in links] + strays
        raise UserFacingError(
            f"{root} holds {len(found)} file(s) that build_manifest.json does not list: "
            f"{_names(found)}; publish sends only the build's own files and refuses a folder "
            "holding anything else — move them out of the build folder"
        )
    records = {entry["path"]: entry for entry in manifest[FILES]}
    for rel in listed:
        path = root / rel
        try:
            info = path.lstat()
            regular = stat.S_ISREG(info.st_mode) and path.resolve() == path
        except OSError:
            regular = False
        if not regular:
            raise UserFacingError(
                f"{path} is listed in build_manifest.json but is missing or not a "
                "regular file inside the build folder; re-run the build command"
            )
        if info.st_size != records[rel].get("bytes"):
            raise changed_since_build(path)
    return {rel: records[rel] for rel in listed}


def changed_since_build(path: Path) -> UserFacingError:
    return UserFacingError(
        f"{path} changed since the build (its size or sha256 differs from "
        "build_manifest.json); re-run the build command to rebuild it"
    )
