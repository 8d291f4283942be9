"""A folder of keyed array entries: the store under `counterfactory benchmark`'s embedding cache
(training/report/cache.py) and the MITL cross-encoder scores
(builders/eccv_positives/mitl/cross_annotators.py).

An entry is an `.npz` of arrays and a `.json` of its full key and record (written last, so an
interrupted write is a miss, never a half entry). The JSON's key is compared on read: a short file
name can never hand one model's numbers to another. An entry is read as untrusted input: one that
is not what `write_entry` writes (a link, a JSON list, another key, arrays of other names, shapes
or kinds, object arrays, a truncated file) raises `BadEntry`, and is never unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
import zlib
from pathlib import Path

import numpy as np

#: What a truncated or foreign `.npz` raises when opened.
UNREADABLE = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)


class BadEntry(Exception):
    """Why a cache entry cannot be used: the caller logs it and computes the entry again."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")


def entry_paths(folder: Path, key: dict, label: str) -> tuple[Path, Path]:
    """The `.npz` and `.json` of `key`: named `label` (what a folder listing tells the entry by)
    and the key's digest."""
    whole = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return folder / f"{label}-{whole}.npz", folder / f"{label}-{whole}.json"


def regular_file(path: Path) -> None:
    # A link may lead out of the cache folder: never followed.
    if not os.path.lexists(path):
        raise BadEntry(path, "missing")
    if path.is_symlink() or not path.is_file():
        raise BadEntry(path, "not a regular file")


def read_record(meta: Path, key: dict) -> dict:
    """The record `write_entry` stored beside `key` in `meta`."""
    regular_file(meta)
    try:
        saved = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadEntry(meta, f"unreadable ({type(err).__name__})") from None
    if not isinstance(saved, dict) or saved.get("key") != key:
        raise BadEntry(meta, "not an entry of this model and data")
    return saved


def _headers(npz: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Name -> (shape, dtype) of each array, read from the `.npy` headers only (an object array or
    a huge member is refused before a byte of its data is read)."""
    out = {}
    with zipfile.ZipFile(npz) as z:
        for name in z.namelist():
            with z.open(name) as fp:
                version = np.lib.format.read_magic(fp)
                read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(
                    version
                )
                if read is None or not name.endswith(".npy"):
                    raise BadEntry(npz, f"{name} is not an array np.savez writes")
                shape, _, dtype = read(fp)
                out[name.removesuffix(".npy")] = (shape, dtype)
    return out


def read_arrays(npz: Path, want: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The arrays of `npz`, checked against `want` (name -> shape): the same names, float arrays
    of those shapes (an `..._idx` array, integer); BadEntry otherwise."""
    regular_file(npz)
    try:
        headers = _headers(npz)
    except UNREADABLE as err:
        raise BadEntry(npz, f"not a readable .npz ({type(err).__name__})") from None
    if headers.keys() != want.keys():
        raise BadEntry(npz, f"holds arrays {sorted(headers)}, expected {sorted(want)}")
    for name, (shape, dtype) in headers.items():
        kind = "i" if name.endswith("_idx") else "f"
        if dtype.kind != kind or shape != want[name]:
            expected = "integer" if kind == "i" else "float"
            raise BadEntry(npz, f"array {name!r} is {dtype} {shape}, expected {expected} {want[name]}")
    try:
        return load_arrays(npz)
    except UNREADABLE as err:
        raise BadEntry(npz, f"not a readable .npz ({type(err).__name__})") from None


def load_arrays(npz: Path) -> dict[str, np.ndarray]:
    """Every array of `npz`, never unpickling one."""
    with np.load(npz, allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


def new_file(folder: Path, suffix: str) -> Path:
    """A new empty file in `folder`, created by this process (never a name someone placed there:
    a link there would redirect the write)."""
    fd, name = tempfile.mkstemp(prefix="writing-", suffix=suffix, dir=folder)
    os.close(fd)
    return Path(name)


def store_arrays(folder: Path, key: dict, label: str, arrays: dict[str, np.ndarray], record: dict) -> Path:
    """`arrays` (np.savez into a `new_file`) and `record` as the entry of `key` (`write_entry`);
    OSError passes up: the caller's numbers still count, uncached."""
    written = new_file(folder, ".npz")
    try:
        np.savez(written, **arrays)
        return write_entry(folder, key, label, written, record)
    finally:
        written.unlink(missing_ok=True)


def write_entry(folder: Path, key: dict, label: str, npz_written: Path, record: dict) -> Path:
    """Move the arrays written to `npz_written` (a `new_file`) into the cache beside `key` and
    `record`; the cached `.npz` path. A bad entry of the same key is replaced."""
    npz, meta = entry_paths(folder, key, label)
    tmp = new_file(folder, ".json.tmp")
    try:
        # NaN (an empty ITM group) round-trips through Python's json.
        tmp.write_text(json.dumps({"key": key, **record}, sort_keys=True))
        os.replace(npz_written, npz)
        os.replace(tmp, meta)
    finally:
        tmp.unlink(missing_ok=True)
    return npz
