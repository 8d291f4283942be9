"""The output folder's guards: one build at a time, one clear line for OS errors, no stale temp files.

- `output_lock(layout)`: an exclusive `filelock` on `.parts/lock`, held by the main process for
  the whole build; a second build into the same folder fails at once instead of racing on the
  same `.tmp` names. (The lock is per process group: the other ranks of an `accelerate launch`
  write only their own parts.)
- `output_errors(root)`: turns the OS errors a user can fix (the folder is a file, no permission,
  read-only, disk full) into one `OutputError` line naming the path and the fix.
- `remove_temp_files(layout)`: a killed or failed write leaves `*.tmp` files (see part_writer,
  merge); they are never reused, so the next run of the build deletes them first.
"""

from __future__ import annotations

import errno
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from builders.engine.errors import OutputError
from builders.engine.sharding.layout import OutputLayout

log = logging.getLogger(__name__)

_FIXES = {
    errno.ENOSPC: ("no space left on the device", "free some space (or use another --output) and "
                   "re-run the same command: finished parts are kept"),
    errno.EDQUOT: ("disk quota exceeded", "free some space (or use another --output) and re-run "
                   "the same command: finished parts are kept"),
    errno.EACCES: ("permission denied", "use a --output folder you can write to, or fix its permissions"),
    errno.EPERM: ("operation not permitted", "use a --output folder you can write to, or fix its permissions"),
    errno.EROFS: ("read-only file system", "use a --output folder on a writable disk"),
    errno.ENOTDIR: ("a file is in the way of a folder", "--output must be a folder (or a path that "
                    "does not exist yet), not a file"),
    errno.EEXIST: ("a file is in the way of a folder", "--output must be a folder (or a path that "
                   "does not exist yet), not a file"),
}


@contextmanager
def output_errors(root: Path) -> Iterator[None]:
    """Re-raise fixable OS errors as one line; other errors (bugs) keep their traceback."""
    try:
        yield
    except OSError as err:
        if err.errno not in _FIXES:
            raise
        what, fix = _FIXES[err.errno]
        raise OutputError(f"{err.filename or root}: {what} ({fix})") from err


def check_output_folder(layout: OutputLayout) -> None:
    """Refuse a folder that is a file, or that holds something other than a counterfactory build."""
    root = layout.root
    if root.exists() and not root.is_dir():
        raise OutputError(f"--output {root} is a file; choose a folder (or a path that does not "
                          "exist yet)")
    if root.is_dir() and not layout.run_file.exists():
        foreign = sorted(p.name for p in root.iterdir() if p.name != layout.parts.name)
        if foreign:
            raise OutputError(f"{root} is not empty and holds no counterfactory build (found "
                              f"{foreign[0]!r}); choose an empty or new --output folder")


@contextmanager
def output_lock(layout: OutputLayout) -> Iterator[None]:
    """Hold `.parts/lock` for the duration of the build, failing at once if another build does."""
    from filelock import FileLock, Timeout

    layout.parts.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(layout.lock_file))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise OutputError(f"another build is writing to {layout.root} (it holds "
                          f"{layout.lock_file}); wait for it to finish, or use another --output") from None
    try:
        yield
    finally:
        lock.release()


def build_in_progress(layout: OutputLayout) -> bool:
    """Whether a build holds the folder's lock right now (e.g. before publishing it)."""
    from filelock import FileLock, Timeout

    if not layout.lock_file.exists():
        return False
    lock = FileLock(str(layout.lock_file))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    lock.release()
    return False


def remove_temp_files(layout: OutputLayout) -> None:
    for folder in (layout.root / "data", layout.parts):
        for path in folder.rglob("*.tmp") if folder.is_dir() else ():
            log.info("removing %s, left by an interrupted write", path)
            path.unlink()
    for path in layout.root.glob("*.tmp"):
        log.info("removing %s, left by an interrupted write", path)
        path.unlink()
