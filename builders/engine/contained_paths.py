"""Paths named by data stay inside the root the user declared: the one containment check.

A file name from an annotation file or a dataset cell (`val2014/x.jpg`, `../../etc/passwd`,
`/home/me/secret.jpg`, a symlink in the image folder) is resolved the way the kernel would open
it, one component at a time, symlinks included, and refused (`PathOutsideRoot`, counted by the
readers as `path_outside_root`) as soon as it would leave the root. The walk never looks at
anything outside: a component outside the root is refused before it is stat'ed, so an outside
file that exists and one that does not give the same answer (nothing is revealed, nothing read).

Policy (docs/what-happens-when.md):
- the root is resolved first, so it may itself be a symlink; so may a layout folder under it
  (`ROOT/val2014`, `ROOT/flickr30k-images`, e.g. on another disk): `ContainedPaths(root, folder)`
  accepts targets inside the resolved root or inside the resolved folder;
- `..` and symlinks inside the root are followed while they stay inside (a symlink from
  `train2017/` to an image in `train2014/` is fine); an absolute name is accepted only when it
  leads inside the root (as the absolute paths of a local image-folder dataset do);
- passing through the ancestors of the root (`/`, `/data`) on the way back in is allowed, since
  resolving the root itself touches them; any other outside component is refused.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from builders.engine.errors import InputFileError, InputProblem

#: The reason readers count a refused path under.
PATH_OUTSIDE_ROOT = "path_outside_root"
#: Symlinks followed per name before giving up (Linux's own limit is 40).
_MAX_LINKS = 40


class PathOutsideRoot(InputFileError):
    """A path named by data leads outside the declared root."""

    reason = PATH_OUTSIDE_ROOT


def is_folder_name(name: str) -> bool:
    """A single path component naming a folder under a root (`val2014`), nothing that climbs."""
    return name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class ContainedPaths:
    """Resolves names under `root/folder` and refuses those that leave it.

    Example: `ContainedPaths(Path("coco"), "val2014").resolve("COCO_val2014_1.jpg")` is the real
    path of that image; `.resolve("../../etc/passwd")` raises `PathOutsideRoot`.
    """

    def __init__(self, root: str | os.PathLike, folder: str | None = None) -> None:
        root = Path(root)
        if folder is not None and not is_folder_name(folder):
            raise InputFileError(
                root, f"{folder!r} is not a folder name", "name a folder directly under the root, like val2014"
            )
        self.root = root
        self.base = root / folder if folder else root
        self._base_real = os.path.realpath(self.base)
        self._roots = tuple(dict.fromkeys((os.path.realpath(root), self._base_real)))
        # The root and folder as given, and the ancestors of both forms: the walk of an absolute
        # name (or of a `..`) passes through them on its way back inside.
        declared = (os.path.abspath(root), os.path.abspath(self.base))
        self._waypoints = {*declared} | {str(a) for p in (*declared, *self._roots) for a in Path(p).parents}

    def _visitable(self, path: str) -> bool:
        return any(_within(path, r) for r in self._roots) or path in self._waypoints

    def _refuse(self, name: str, where: str) -> PathOutsideRoot:
        return PathOutsideRoot(
            self.base / name if not os.path.isabs(name) else name,
            f"{name!r} leads to {where}, outside the root {self.root}",
            "image files must lie inside the source root; fix the file name or move the file into the root",
        )

    def resolve(self, name: str) -> Path:
        """The real path `name` (relative to `root/folder`, or absolute) opens, if inside."""
        if not isinstance(name, str) or "\0" in name:
            raise self._refuse(str(name), "no path")
        current = "/" if os.path.isabs(name) else self._base_real
        pending = [p for p in name.split("/") if p not in ("", ".")]
        links = 0
        while pending:
            part = pending.pop(0)
            step = os.path.dirname(current) if part == ".." else os.path.join(current, part)
            if not self._visitable(step):
                raise self._refuse(name, step)
            if part == "..":
                current = step
                continue
            try:
                mode = os.lstat(step).st_mode
            except OSError:  # missing (or not a folder): the opener fails on it, naming the path
                rest = os.path.normpath(os.path.join(step, *pending))
                if not any(_within(rest, r) for r in self._roots):
                    raise self._refuse(name, rest) from None
                return Path(step, *pending)
            if not stat.S_ISLNK(mode):
                current = step
                continue
            links += 1
            if links > _MAX_LINKS:  # a loop, all inside: opening it fails (ELOOP), naming the file
                return Path(step, *pending)
            target = os.readlink(step)
            if os.path.isabs(target):
                current = "/"
            pending = [p for p in target.split("/") if p not in ("", ".")] + pending
        if not any(_within(current, r) for r in self._roots):
            raise self._refuse(name, current)
        return Path(current)

    def problem(self, name: str, where: str) -> InputProblem | None:
        """`path_outside_root` (detail prefixed with `where`, the file and row) or None: how
        readers mark a record whose file is outside, so builders skip and count it."""
        try:
            self.resolve(name)
        except PathOutsideRoot as err:
            return InputProblem(PATH_OUTSIDE_ROOT, f"{where}: {err}")
        return None
