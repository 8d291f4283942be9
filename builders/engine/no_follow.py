"""Reading, writing and deleting below a folder without following a symlink below it.

The folder itself may be a symlink (an output folder on another disk is the user's choice); every
component below it must be a real folder, and the file a regular file. Two tools:

- `open_no_follow(folder, rel, not_regular)`: a read descriptor, for what the project reads back
  from its own folders (a build's parts and stats, the shards a manifest lists), where a planted
  link must never redirect the read. A FIFO is opened without waiting for a writer, then refused
  as not regular.
- `RootDir`: an output root opened once, every write, rename and delete below it made relative to
  its descriptor (`dir_fd=`), each folder below it opened with `O_NOFOLLOW`. A component that is a
  symlink is refused (`LinkRefused`, one line naming the link) and nothing is written through it.
  Since every step resolves from a descriptor, there is no check-then-act race: a folder swapped
  for a link after a check is met as a link at the act (or the act happens in the folder that was
  opened, never in the link's target).
"""

from __future__ import annotations

import errno
import os
import stat
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Callable, Iterator

from builders.engine.errors import OutputError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
# O_NONBLOCK: opening a planted FIFO must not wait for a writer.
_MODES = {
    "rb": os.O_RDONLY | os.O_NONBLOCK,
    "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "xb": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
    "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "r+b": os.O_RDWR,
}


def open_no_follow(folder: Path, rel: str | Path, not_regular: Callable[[], Exception]) -> int:
    """A read descriptor of `folder/rel`. Raises FileNotFoundError when it does not exist, and
    `not_regular()` when a component below `folder` is a symlink or the file is not regular."""
    names = Path(rel).parts
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in names[:-1]:
            below = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = below
        file_fd = os.open(names[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError as err:
        if err.errno == errno.ENOENT:
            raise FileNotFoundError(Path(folder) / rel) from None
        if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
            raise not_regular() from None
        raise
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(file_fd).st_mode):
        os.close(file_fd)
        raise not_regular()
    return file_fd


class LinkRefused(OutputError):
    """A component under an output root is a symlink (or not what it must be): nothing is written
    or deleted through it."""


class RootDir:
    """An output root, opened once; paths are relative to it (`str` or `PurePosixPath`, no `..`).

    Use as a context manager (`with RootDir(root, create=True) as out:`), or `close()` it. The root
    is created when missing and `create` is set (its parents may be links: the user named it)."""

    def __init__(self, root: Path, create: bool = False) -> None:
        self.root = Path(root)
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        self.fd = -1
        self.fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)

    def __enter__(self) -> RootDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        # A root a caller forgot to close (an error path) must not hold its descriptor forever.
        if getattr(self, "fd", -1) >= 0:
            self.close()

    def path(self, rel: str | PurePosixPath = "") -> Path:
        """The path a message names (never opened: every act goes through the descriptor)."""
        return self.root.joinpath(*_parts(rel))

    def _refuse(self, parts: tuple[str, ...]) -> LinkRefused:
        return LinkRefused(
            f"{self.path('/'.join(parts))} is a symlink (or not a folder) inside {self.root}; counterfactory "
            "never writes or deletes through a link — remove the link (or choose another output folder) and "
            "re-run; nothing was written or deleted through it"
        )

    def folder(self, rel: str | PurePosixPath = "", create: bool = False) -> int:
        """A descriptor of the folder `rel` (the caller closes it), each component opened without
        following a link; missing ones made when `create`. FileNotFoundError when missing."""
        fd = os.dup(self.fd)
        parts = _parts(rel)
        try:
            for i, name in enumerate(parts):
                if create:
                    try:
                        os.mkdir(name, 0o777, dir_fd=fd)
                    except FileExistsError:
                        pass
                try:
                    below = os.open(name, _DIR, dir_fd=fd)
                except OSError as err:
                    if err.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise self._refuse(parts[: i + 1]) from None
                    if err.errno == errno.ENOENT:
                        raise FileNotFoundError(errno.ENOENT, "No such folder", str(self.path(rel))) from None
                    raise
                os.close(fd)
                fd = below
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextmanager
    def parent(self, rel: str | PurePosixPath, create: bool = False) -> Iterator[tuple[int, str]]:
        """`(descriptor of rel's folder, rel's last name)`, the descriptor closed afterwards."""
        parts = _parts(rel)
        if not parts:
            raise ValueError("the root itself has no parent inside it")
        fd = self.folder(PurePosixPath(*parts[:-1]) if parts[:-1] else "", create=create)
        try:
            yield fd, parts[-1]
        finally:
            os.close(fd)

    def lstat(self, rel: str | PurePosixPath) -> os.stat_result | None:
        """The entry's own status (a link's, not its target's); None when it (or a folder above
        it) does not exist. A link above it is refused."""
        try:
            with self.parent(rel) as (fd, name):
                return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def open(self, rel: str | PurePosixPath, mode: str = "rb", create_folders: bool = False) -> BinaryIO:
        """A binary file object of `rel` (`rb`, `wb`, `xb`, `ab`, `r+b`), never through a link; a
        file that is a link, or not regular, is refused."""
        with self.parent(rel, create=create_folders) as (fd, name):
            try:
                file_fd = os.open(name, _MODES[mode] | os.O_NOFOLLOW, 0o666, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                    raise self._refuse(_parts(rel)) from None
                raise
        if not stat.S_ISREG(os.fstat(file_fd).st_mode):
            os.close(file_fd)
            raise self._refuse(_parts(rel))
        if mode == "rb":
            os.set_blocking(file_fd, True)
        return os.fdopen(file_fd, mode)

    @contextmanager
    def writing(self, rel: str | PurePosixPath) -> Iterator[BinaryIO]:
        """A file object whose bytes replace `rel` whole when the block ends: a `.tmp` sibling,
        synced, renamed over it (in the same opened folder); an exception removes the temporary
        file and leaves `rel` as it was."""
        parts = _parts(rel)
        tmp = PurePosixPath(*parts[:-1], parts[-1] + ".tmp")
        try:
            with self.open(tmp, "wb", create_folders=True) as fh:
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
            self.replace(tmp, rel)
        except BaseException:
            self.unlink(tmp, missing_ok=True)
            raise

    def write_atomic(self, rel: str | PurePosixPath, data: bytes | memoryview) -> None:
        """Write `rel` whole (`writing`)."""
        with self.writing(rel) as fh:
            fh.write(data)

    def replace(self, src: str | PurePosixPath, dst: str | PurePosixPath) -> None:
        """`os.replace` of `src` onto `dst`, both relative to the root, neither folder a link."""
        with self.parent(src) as (src_fd, src_name), self.parent(dst, create=True) as (dst_fd, dst_name):
            os.replace(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)

    def unlink(self, rel: str | PurePosixPath, missing_ok: bool = False) -> None:
        """Delete the file (or the link itself) `rel`; never anything a link above it points to."""
        try:
            with self.parent(rel) as (fd, name):
                os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def rmdir(self, rel: str | PurePosixPath) -> None:
        with self.parent(rel) as (fd, name):
            os.rmdir(name, dir_fd=fd)

    def walk(self, rel: str | PurePosixPath = "") -> Iterator[tuple[PurePosixPath, list[str], list[str], list[str]]]:
        """`(folder, sub-folders, files, links)` for `rel` and every folder below it, top-down,
        never following a link (links are listed, whatever they point to, not entered)."""
        top = self.folder(rel)
        try:
            for here, dirs, files, fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
                links = [n for n in dirs + files if stat.S_ISLNK(os.stat(n, dir_fd=fd, follow_symlinks=False).st_mode)]
                dirs[:] = [n for n in dirs if n not in links]
                yield (
                    PurePosixPath(*_parts(rel), *PurePosixPath(here).parts),
                    dirs,
                    [n for n in files if n not in links],
                    links,
                )
        finally:
            os.close(top)

    def remove_tree(self, rel: str | PurePosixPath) -> None:
        """Delete the folder `rel` and everything in it, deepest first; a link inside is deleted
        itself, never followed. For folders of our own only (the callers check ownership first)."""
        found = list(self.walk(rel))
        for here, dirs, files, links in reversed(found):
            for name in files + links:
                self.unlink(here / name)
            for name in dirs:
                self.rmdir(here / name)
        self.rmdir(rel)


@contextmanager
def opened(root: Path | RootDir) -> Iterator[RootDir]:
    """`root` itself when it is opened already (the caller's, left open), else `root` opened for
    the duration."""
    if isinstance(root, RootDir):
        yield root
        return
    with RootDir(root) as out:
        yield out


def _parts(rel: str | PurePosixPath) -> tuple[str, ...]:
    """`rel`'s names, refusing an absolute path, `..` or an empty name (a bug, not user input)."""
    parts = tuple(p for p in PurePosixPath(rel).parts if p != ".")
    if PurePosixPath(rel).is_absolute() or ".." in parts:
        raise ValueError(f"not a path inside the root: {rel!r}")
    return parts
