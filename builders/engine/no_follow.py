"""Open a file of a folder without following a symlink below it: the one such walk, used for what
the project reads back from its own folders (a build's parts and stats, the shards a manifest
lists), where a planted link must never redirect the read.

The folder itself may be a symlink (an output folder on another disk is the user's choice); every
component below it must be a real folder, and the file a regular file. A FIFO is opened without
waiting for a writer, then refused as not regular.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Callable


def open_no_follow(folder: Path, rel: str | Path, not_regular: Callable[[], Exception]) -> int:
    """A read descriptor of `folder/rel`. Raises FileNotFoundError when it does not exist, and
    `not_regular()` when a component below `folder` is a symlink or the file is not regular."""
    names = Path(rel).parts
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in names[:-1]:
            below = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = below
        # O_NONBLOCK: opening a planted FIFO must not wait for a writer.
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
