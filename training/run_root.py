"""The run folder (`--output`) opened once: the one way the trainer writes, renames or deletes
below it (#49).

`RunRoot` is builders/engine/no_follow.py's `RootDir` (every act relative to the folder's
descriptor, each folder below it opened with `O_NOFOLLOW`: a symlinked component is refused in
one line, and a folder swapped for a link after a check is met as a link at the act) with what the
trainer's writers need besides:

- `refuse_links`: one line naming every symlink in the run folder, before the run writes or
  deletes anything (nothing the trainer writes is a link, so a link there was put there);
- `write_text`: a file written whole (`RootDir.write_atomic`);
- `at`: a path, for a library that only takes one (`save_pretrained`, safetensors, TensorBoard
  aside), that resolves through the opened folder's descriptor (`/proc/self/fd/N`), so what the
  library writes lands in the folder that was opened, never in a link's target.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Iterator

from builders.engine.errors import OutputError
from builders.engine.no_follow import RootDir
from builders.engine.sharding.layout import PARTS_DIR

_FDS = Path("/proc/self/fd")  # Linux: a folder descriptor's own path
_NAMED = 5  # how many links one error line names


class RunRoot(RootDir):
    """A run folder opened once (`with RunRoot(output) as root:`); paths are relative to it."""

    def links(self, skip: tuple[str, ...] = ()) -> list[str]:
        """Every symlink below the run folder (relative paths, never followed), `.parts/` and the
        top-level folders in `skip` not entered (their own checks name what they hold)."""
        found = []
        for here, dirs, _, links in self.walk():
            found += [(here / name).as_posix() for name in links]
            if here == PurePosixPath("."):
                dirs[:] = [d for d in dirs if d not in (PARTS_DIR, *skip)]
        return sorted(found)

    def refuse_links(self, flag: str, skip: tuple[str, ...] = ()) -> None:
        """One line naming the symlinks `links` finds, when there are any."""
        found = self.links(skip)
        if found:
            more = f" and {len(found) - _NAMED} more" if len(found) > _NAMED else ""
            names = ", ".join(f"symlink {rel}" for rel in found[:_NAMED])
            raise OutputError(
                f"{flag}: the run folder {self.root} holds {names}{more}; the trainer never writes or "
                "deletes through a link — remove the link (or give another --output) and re-run; "
                "nothing was written or deleted"
            )

    def entries(self, rel: str | PurePosixPath = "") -> tuple[list[str], list[str], list[str]]:
        """`(sub-folders, files, links)` directly in the folder `rel`, sorted; a link above it (or
        `rel` itself a link) is refused."""
        found = self.walk(rel)
        try:
            _, dirs, files, links = next(found)
        finally:
            found.close()
        return sorted(dirs), sorted(files), sorted(links)

    def write_text(self, rel: str | PurePosixPath, text: str) -> None:
        self.write_atomic(rel, text.encode())

    @contextmanager
    def at(self, rel: str | PurePosixPath, create: bool = True) -> Iterator[Path]:
        """The folder `rel` (opened without following a link) as a path that resolves through its
        descriptor, for a library that takes a path; valid inside the block."""
        fd = self.folder(rel, create=create)
        try:
            yield _FDS / str(fd) if _FDS.is_dir() else self.path(rel)
        finally:
            os.close(fd)
