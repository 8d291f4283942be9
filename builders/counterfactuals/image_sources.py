"""Where imported image pairs are read from (`--images-from`; builders/counterfactuals/METHOD.md
§2, "Imported image pairs"): a folder, or a zip read in place (never extracted).

A layout names a row's two images from its id (`Layout`), in the source's root or under its one
top-level folder (`base`, as zips usually hold):
- `folders`: `synthetic-images-for-original-captions/{id}.jpg` and
  `synthetic-images-for-counterfactual-captions/{id}.jpg`, the folders the paper's evaluation
  code reads;
- `numbered`: `{id}_0.jpg` and `{id}_1.jpg`;
- `release`: `{id}_img_0.jpg` and `{id}_img_1.jpg`, the names the Hub release's loading script
  reads from its `images.zip` (under `images/`);
- a pattern (`--images-pattern`, relative to the root): `{id}` and `{n}`, or one per image.
The layouts look for `.jpg`, then `.png` (as the evaluation code does). `auto` detects the one
layout whose files are there (`detect_layout`); two of them, or none, is one line.

Containment (builders/engine/contained_paths.py): a name an id makes with a `..` component, a
NUL or an absolute name is never looked up (`climbs`). In a folder every name is resolved by
`ContainedPaths`, so a symlink out is refused (`path_outside_root`) before anything is opened. In
a zip only members with plain relative names are indexed: a member named with `..`, absolutely,
with a backslash or NUL, a symlink member, or a name held by two members is never read (counted
in `ZipSource.ignored`). An image file of more than the source's `max_bytes` (`--max-image-bytes`)
is `image_too_large`, unread (a zip member's bytes are also counted as they are read: its header
may understate them).

`digest()` is what the card names: the zip's sha256, or for a folder a sha256 over every file's
sha256 and relative name (symlinks by their link text, never followed).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from builders.engine.contained_paths import ContainedPaths, PathOutsideRoot
from builders.engine.errors import InputFileError
from loading_scripts.images import ImageProblem

log = logging.getLogger(__name__)

#: The folders of the paper's evaluation code (original, counterfactual).
FOLDER_NAMES = ("synthetic-images-for-original-captions", "synthetic-images-for-counterfactual-captions")
#: Looked for in this order, as the paper's evaluation code does.
EXTENSIONS = (".jpg", ".png")
#: Per layout, the names of image 0 and image 1 with `{id}` in them (before the extension).
_STEMS = {
    "folders": (f"{FOLDER_NAMES[0]}/{{id}}", f"{FOLDER_NAMES[1]}/{{id}}"),
    "numbered": ("{id}_0", "{id}_1"),
    "release": ("{id}_img_0", "{id}_img_1"),
}
#: A file name of the `release` / `numbered` layouts (checked in this order: `x_img_0.jpg` is
#: also `{id}_0` with the id `x_img`, and is taken for the release's).
_RELEASE_FILE = re.compile(r".+_img_[01]\.(jpg|png)")
_NUMBERED_FILE = re.compile(r".+_[01]\.(jpg|png)")
#: Folders a zip tool adds beside the content (macOS), never a layout's top-level folder.
_NOT_CONTENT = ("__MACOSX",)
_FIX_LAYOUT = (
    "name the layout with --images-layout, or the files with --images-pattern (e.g. 'images/{id}_img_{n}.jpg')"
)


@dataclass(frozen=True)
class ImageRef:
    """One image found in the source: its name there, size, and a zip member's CRC-32 (so an
    item's digest changes with the member's content: `builders.engine.sharding.inputs`)."""

    name: str
    size: int
    crc: int | None = None


@dataclass(frozen=True)
class Layout:
    """How the images of a row are named: per image, the candidate names with `{id}`."""

    name: str
    base: str
    templates: tuple[tuple[str, ...], tuple[str, ...]]

    def names(self, row_id: str, n: int) -> tuple[str, ...]:
        """Image `n`'s candidate names for `row_id`, relative to the source root."""
        return tuple(self.base + t.replace("{id}", row_id) for t in self.templates[n])

    def describe(self) -> str:
        return " and ".join(self.base + t[0] for t in self.templates)


def climbs(name: str) -> bool:
    """A name that is absolute, holds a NUL or a `..` component: never looked up."""
    return name.startswith("/") or "\0" in name or ".." in name.split("/")


def layout_of(name: str, base: str) -> Layout:
    return Layout(
        name,
        base,
        tuple(
            tuple(stem + ext for ext in EXTENSIONS)  # type: ignore[arg-type]
            for stem in _STEMS[name]
        ),
    )


def pattern_layout(patterns: tuple[str, ...]) -> Layout:
    """The layout of `--images-pattern`: one pattern with `{id}` and `{n}`, or two with `{id}`."""
    one = len(patterns) == 1
    for pattern in patterns:
        needs = ("{id}", "{n}") if one else ("{id}",)
        rest = pattern.replace("{id}", "").replace("{n}", "" if one else "{n}")
        if any(p not in pattern for p in needs) or "{" in rest or "}" in rest or climbs(pattern) or not pattern:
            raise InputFileError(
                "--images-pattern",
                f"{pattern!r} is not a name pattern",
                (
                    "write a path relative to the folder or zip root with {id}"
                    + (
                        " and {n}, e.g. 'images/{id}_img_{n}.jpg'"
                        if one
                        else " in each, e.g. 'orig/{id}.png' 'cf/{id}.png'"
                    )
                ),
            )
    templates = (
        ((patterns[0].replace("{n}", "0"),), (patterns[0].replace("{n}", "1"),))
        if one
        else ((patterns[0],), (patterns[1],))
    )
    return Layout("pattern", "", templates)


def detect_layout(source: "FolderSource | ZipSource", wanted: str) -> Layout:
    """The layout (`wanted`, or with `auto` the one whose files are there), at the root of the
    source or else under its one top-level folder; one line when none or several are there."""
    # Files beside the top-level folder (a README, the pairs' .jsonl) do not make it ambiguous.
    tops = [n for n, is_dir in source.entries("") if is_dir and n not in _NOT_CONTENT and not n.startswith(".")]
    found: set[str] = set()
    for base in ["", *([tops[0] + "/"] if len(tops) == 1 else [])]:
        found = _layouts_at(source, base)
        if wanted in found or (wanted == "auto" and len(found) == 1):
            return layout_of(found.pop() if wanted == "auto" else wanted, base)
        if wanted == "auto" and found:
            break
    if wanted != "auto":
        raise InputFileError(
            source.label,
            f"holds no image named as the {wanted} layout says "
            f"({layout_of(wanted, '').describe()}), at its top or under its one "
            "top-level folder",
            _FIX_LAYOUT,
        )
    what = (
        f"holds images of several layouts ({', '.join(sorted(found))})"
        if found
        else "holds no image of a known layout (synthetic-images-for-original-captions/{id}.jpg + "
        "synthetic-images-for-counterfactual-captions/{id}.jpg, {id}_0.jpg + {id}_1.jpg, "
        "{id}_img_0.jpg + {id}_img_1.jpg) at its top or under its one top-level folder"
    )
    raise InputFileError(source.label, what, _FIX_LAYOUT)


def _layouts_at(source: "FolderSource | ZipSource", base: str) -> set[str]:
    """The layouts with files directly under `base` (names only: nothing is read)."""
    found: set[str] = set()
    dirs: set[str] = set()
    for name, is_dir in source.entries(base):
        if is_dir:
            dirs.add(name)
        elif _RELEASE_FILE.fullmatch(name):
            found.add("release")
        elif _NUMBERED_FILE.fullmatch(name):
            found.add("numbered")
    if set(FOLDER_NAMES) <= dirs:
        found.add("folders")
    return found


def _read_bounded(f: Any, name: str, max_bytes: int) -> bytes:
    data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise _too_large(name, len(data), max_bytes)
    return data


def _too_large(name: str, size: int, max_bytes: int) -> ImageProblem:
    """An image file over `--max-image-bytes`: counted `image_too_large`, never kept."""
    return ImageProblem(
        name,
        "image_too_large",
        f"the file has {size:,} bytes or more, above --max-image-bytes ({max_bytes:,})",
        "check the file (it was not kept), or raise --max-image-bytes",
    )


class FolderSource:
    """Images in a folder (`root`, resolved): every name goes through `ContainedPaths`."""

    kind = "folder"

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root, self.max_bytes = root, max_bytes
        self.label = root.name
        self.paths = ContainedPaths(root)

    def entries(self, base: str) -> Iterator[tuple[str, bool]]:
        """(name, is a folder) of the entries directly under `base` (names only). A symlink is
        a folder when it leads to one inside the root: its target is looked at only then."""
        try:
            with os.scandir(self.paths.resolve(base or ".")) as it:
                listed = [(e.name, e.is_dir(follow_symlinks=False), e.is_symlink()) for e in it]
        except (PathOutsideRoot, OSError):
            return
        for name, is_dir, is_link in listed:
            if is_link:
                try:
                    is_dir = self.paths.resolve(base + name).is_dir()
                except PathOutsideRoot:
                    continue
            yield name, is_dir

    def find(self, name: str) -> ImageRef | None:
        """The image file `name`, None when there is none; `PathOutsideRoot` when it leads out."""
        try:
            st = os.stat(self.paths.resolve(name))
        except OSError:
            return None
        return ImageRef(name, st.st_size) if stat.S_ISREG(st.st_mode) else None

    def read(self, ref: ImageRef) -> bytes:
        if ref.size > self.max_bytes:
            raise _too_large(ref.name, ref.size, self.max_bytes)
        path = self.paths.resolve(ref.name)  # again: the folder may have changed since
        try:
            # O_NOFOLLOW: a file swapped for a symlink since it was resolved is not followed.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                return _read_bounded(f, ref.name, self.max_bytes)
        except OSError as err:
            raise ImageProblem(
                ref.name, "unreadable_image", f"cannot read the file ({err.strerror})", "check the image folder"
            ) from None

    def digest(self) -> dict[str, Any]:
        """sha256 over one line per entry: `<file sha256>  <relative name>` for a file,
        `-> <link text>  <relative name>` for a symlink (never followed, its target never
        looked at); a folder's files and links by name, then its sub-folders by name."""
        h = hashlib.sha256()
        files = self._digest_folder(self.root, h)
        return {"kind": self.kind, "name": self.label, "sha256": h.hexdigest(), "files": files}

    def _digest_folder(self, folder: Path, h: Any) -> int:
        with os.scandir(folder) as it:
            entries = sorted(
                (e.name, e.is_symlink(), e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False)) for e in it
            )
        files = 0
        for name, is_link, _, is_file in entries:
            rel = (folder / name).relative_to(self.root).as_posix()
            if is_link:
                h.update(f"-> {os.readlink(folder / name)}  {rel}\n".encode("utf-8", "surrogateescape"))
            elif is_file:
                h.update(f"{_file_sha256(folder / name)}  {rel}\n".encode("utf-8", "surrogateescape"))
                files += 1
        for name, _, is_dir, _ in entries:
            if is_dir:
                files += self._digest_folder(folder / name, h)
        return files


class ZipSource:
    """Images in a zip, read member by member in place. Only safe members are indexed (module
    docstring); `ignored` counts the others by why."""

    kind = "zip"

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path, self.max_bytes = path, max_bytes
        self.label = path.name
        try:
            self.zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError, ValueError) as err:
            raise InputFileError(
                path, f"cannot be read as a zip file ({err})", "give a .zip file or a folder of images"
            ) from None
        self.index: dict[str, zipfile.ZipInfo] = {}
        self.ignored: Counter[str] = Counter()
        seen: Counter[str] = Counter(i.filename for i in self.zip.infolist())
        for info in self.zip.infolist():
            why = _unsafe_member(info, seen)
            if why:
                self.ignored[why] += 1
                log.debug("%s: member %r is not read (%s)", self.label, info.orig_filename, why)
            elif not info.is_dir():
                self.index[info.filename] = info
        if self.ignored:
            log.warning(
                "%s: %s member(s) are never read (%s)",
                self.label,
                sum(self.ignored.values()),
                ", ".join(f"{k}: {v}" for k, v in sorted(self.ignored.items())),
            )

    def entries(self, base: str) -> Iterator[tuple[str, bool]]:
        dirs: set[str] = set()
        for name in self.index:
            if name.startswith(base):
                first, sep, _ = name[len(base) :].partition("/")
                if not sep:
                    yield first, False
                elif first not in dirs:
                    dirs.add(first)
                    yield first, True

    def find(self, name: str) -> ImageRef | None:
        info = self.index.get(name)
        return ImageRef(name, info.file_size, info.CRC) if info else None

    def read(self, ref: ImageRef) -> bytes:
        info = self.index[ref.name]
        if info.file_size > self.max_bytes:
            raise _too_large(ref.name, info.file_size, self.max_bytes)
        try:
            with self.zip.open(info) as f:
                return _read_bounded(f, ref.name, self.max_bytes)
        # A damaged member (bad CRC, truncated), an encrypted one, an unknown compression.
        except (zipfile.BadZipFile, RuntimeError, NotImplementedError, OSError, EOFError, ValueError) as err:
            raise ImageProblem(
                ref.name, "unreadable_image", f"cannot read the zip member ({err})", "re-download the zip"
            ) from None

    def digest(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.label,
            "sha256": _file_sha256(self.path),
            "members": len(self.index),
            "ignored_members": dict(sorted(self.ignored.items())),
        }


def _unsafe_member(info: zipfile.ZipInfo, seen: Counter[str]) -> str | None:
    """Why a zip member is never read, or None."""
    if stat.S_ISLNK(info.external_attr >> 16):
        return "symlink"
    name = info.orig_filename
    if climbs(name) or "\\" in name or re.match(r"[A-Za-z]:", name):
        return "unsafe_name"
    if seen[info.filename] > 1:  # which of them would be the image?
        return "duplicate_name"
    return None


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def open_source(images_from: str, max_bytes: int) -> FolderSource | ZipSource:
    """The folder or zip `--images-from` names (resolved once: the user's declared root), whose
    image files of more than `max_bytes` are `image_too_large`."""
    path = Path(images_from).expanduser()
    if path.is_dir():
        return FolderSource(path.resolve(), max_bytes)
    if path.is_file():
        if not zipfile.is_zipfile(path):
            raise InputFileError(
                path, "is neither a folder nor a zip file", "give --images-from a folder of images or a .zip"
            )
        return ZipSource(path.resolve(), max_bytes)
    raise InputFileError(path, "no such file or folder", "give --images-from a folder of images or a .zip")
