"""The output folder's guards: one build at a time, one clear line for OS errors, no stale temp files.

- `output_lock(layout)`: an exclusive lock on `.parts/lock`, held by the main process for
  the whole build; a second build into the same folder fails at once instead of racing on the
  same `.tmp` names. (The lock is per process group: the other ranks of an `accelerate launch`
  write only their own parts.) Job-array workers (see `runner`) each hold their own
  `.parts/worker-NNNNN.lock` and take the folder's lock only to check the run fingerprint. A
  lock is an `flock` on a regular file opened without following a symlink: a planted link is
  refused in one line, never locked or created through. The lock goes with the process (a killed
  build leaves the file, not the lock).
- `output_errors(root)`: turns the OS errors a user can fix (the folder is a file, no permission,
  read-only, disk full) into one `OutputError` line naming the path and the fix.
- `remove_temp_files(layout)`: a killed or failed write leaves `*.tmp` files (see part_writer,
  merge); they are never reused, so the next run of the build deletes them first. Like every
  write and delete below the output, they are found and deleted relative to the root's
  descriptor (`OutputLayout.out`): a linked `data/` or `.parts/` is refused in one line before
  anything is deleted, and no file outside the output is ever listed.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import time
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Iterator

from builders.engine.errors import OutputError
from builders.engine.owned_files import remove_files
from builders.engine.sharding.layout import PARTS_DIR, OutputLayout

log = logging.getLogger(__name__)

_FIXES = {
    errno.ENOSPC: (
        "no space left on the device",
        "free some space (or use another --output) and re-run the same command: finished parts are kept",
    ),
    errno.EDQUOT: (
        "disk quota exceeded",
        "free some space (or use another --output) and re-run the same command: finished parts are kept",
    ),
    errno.EACCES: ("permission denied", "use a --output folder you can write to, or fix its permissions"),
    errno.EPERM: ("operation not permitted", "use a --output folder you can write to, or fix its permissions"),
    errno.EROFS: ("read-only file system", "use a --output folder on a writable disk"),
    errno.ENOTDIR: (
        "a file is in the way of a folder",
        "--output must be a folder (or a path that does not exist yet), not a file",
    ),
    errno.EEXIST: (
        "a file is in the way of a folder",
        "--output must be a folder (or a path that does not exist yet), not a file",
    ),
    errno.ELOOP: (
        "a symlink is in the way of a file the build writes",
        "remove it: the build never writes through a link",
    ),
}

#: How often a lock held by another process is tried again while waiting for it.
_POLL_S = 0.05


@contextmanager
def output_errors(root: Path) -> Iterator[None]:
    """Re-raise fixable OS errors as one line; other errors (bugs) keep their traceback."""
    try:
        yield
    except OSError as err:
        if err.errno not in _FIXES:
            raise
        what, fix = _FIXES[err.errno]
        # A call relative to a folder's descriptor names only the last component: name the root.
        where = err.filename if err.filename and os.path.isabs(err.filename) else f"{root} ({err.filename or '.'})"
        raise OutputError(f"{where}: {what} ({fix})") from err


def check_output_folder(layout: OutputLayout) -> None:
    """Refuse a folder that is a file, or that holds something other than a counterfactory build."""
    root = layout.root
    if root.exists() and not root.is_dir():
        raise OutputError(f"--output {root} is a file; choose a folder (or a path that does not exist yet)")
    if root.is_dir() and not layout.run_file.exists():
        foreign = sorted(p.name for p in root.iterdir() if p.name != layout.parts.name)
        if foreign:
            raise OutputError(
                f"{root} is not empty and holds no counterfactory build (found "
                f"{foreign[0]!r}); choose an empty or new --output folder"
            )


@contextmanager
def output_lock(layout: OutputLayout, wait_s: float = 0) -> Iterator[None]:
    """Hold `.parts/lock` for the duration of the build, failing if another build holds it for
    longer than `wait_s` (job-array workers hold it only while checking the fingerprint)."""
    with _held(layout, layout.lock_file, wait_s, "another build"):
        yield


@contextmanager
def worker_lock(layout: OutputLayout, worker: int) -> Iterator[None]:
    """Hold job-array worker `worker`'s own lock while it builds: a second copy of the same worker
    fails at once, and `--merge-only` can tell that a worker is still writing."""
    with _held(layout, layout.worker_lock_file(worker), 0, f"array worker {worker}"):
        yield


def running_workers(layout: OutputLayout) -> list[int]:
    """The job-array workers holding their lock on `layout` right now."""
    return [
        int(path.stem.split("-")[1]) for path in sorted(layout.parts.glob("worker-*.lock")) if _is_held(layout, path)
    ]


@contextmanager
def _held(layout: OutputLayout, path: Path, wait_s: float, holder: str) -> Iterator[None]:
    fd = _open_lock(layout, path, create=True)
    assert fd is not None
    try:
        deadline = time.monotonic() + wait_s
        while not _try_lock(fd):
            if time.monotonic() >= deadline:
                raise OutputError(
                    f"{holder} is writing to {layout.root} (it holds {path}); wait "
                    "for it to finish, or use another --output"
                )
            time.sleep(_POLL_S)
        yield  # the lock goes with the descriptor, closed below
    finally:
        os.close(fd)


def _open_lock(layout: OutputLayout, path: Path, create: bool) -> int | None:
    """A descriptor of the lock file `path` (None: it does not exist and `create` is False).

    The lock is taken on a regular file inside `.parts/`, opened without following a symlink: a
    lock file (or `.parts/` itself) planted as a link is refused, never locked or created through.
    """
    if not create and not layout.root.is_dir():
        return None  # nothing to ask about, and nothing to create
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | (os.O_CREAT if create else 0)
    try:
        with layout.out.parent(layout.rel(path), create=create) as (folder, name):
            fd = os.open(name, flags, 0o644, dir_fd=folder)
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.EISDIR):
            raise
        fd = None
    if fd is None or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd is not None:
            os.close(fd)
        raise OutputError(
            f"{path} is a symlink or not a regular file; a lock is never taken through a link — remove it and re-run"
        )
    return fd


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _is_held(layout: OutputLayout, path: Path) -> bool:
    fd = _open_lock(layout, path, create=False)
    if fd is None:
        return False
    try:
        return not _try_lock(fd)
    finally:
        os.close(fd)


def build_in_progress(layout: OutputLayout) -> bool:
    """Whether a build holds the folder's lock right now (e.g. before publishing it)."""
    return _is_held(layout, layout.lock_file)


def remove_part_temp_files(layout: OutputLayout, keys: list[str], parts: list[int]) -> None:
    """Remove the `.tmp` files of `parts` only: a job-array worker must not touch the files other
    workers are writing."""
    for part in parts:
        for path in [layout.stats_file(part), *(layout.part_file(key, part) for key in keys)]:
            tmp = layout.rel(path) + ".tmp"
            if _is_file(layout, tmp):
                log.info("removing %s, left by an interrupted write", layout.root / tmp)
                layout.out.unlink(tmp)


def _is_file(layout: OutputLayout, rel: str) -> bool:
    try:
        info = layout.out.lstat(rel)
    except NotADirectoryError:
        return False
    return info is not None and stat.S_ISREG(info.st_mode)


def remove_temp_files(layout: OutputLayout) -> None:
    """Remove the `*.tmp` files under `data/` and `.parts/` and at the top of the output (regular
    files only: a link is never ours), every folder listed and every file deleted relative to the
    root's descriptor; a linked folder among them is refused before anything is deleted."""
    out = layout.out
    _, _, top, _ = next(out.walk())
    found = [PurePosixPath(name) for name in top]
    for folder in ("data", PARTS_DIR):
        if out.lstat(folder) is not None:
            found += [here / name for here, _, files, _ in out.walk(folder) for name in files]
    found = [rel for rel in found if rel.name.endswith(".tmp")]
    for rel in found:
        log.info("removing %s, left by an interrupted write", layout.root / rel)
    remove_files(out, [rel.as_posix() for rel in found])
