"""What a published manifest says about where a build came from, without leaking the machine.

- `git_state()`: the commit of the counterfactory checkout that ran the build, and whether its
  tracked files had uncommitted changes (None outside a git checkout, e.g. a wheel install).
- `portable(value, root)`: every absolute local path in a manifest becomes something meaningful
  elsewhere: a path inside the build → relative to it; a Hugging Face cache snapshot →
  `ORG/NAME@REVISION`; any other existing file or folder (a local model, the NLTK tagger) →
  `local:NAME@sha256:DIGEST` of its contents; anything else → relative to the build. Prose that
  quotes one of these paths (a card sentence naming the model) gets the same name. So no card or
  manifest names the builder's home or temp directories.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path
from typing import Any

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: `prefix:` / `--flag=` before an absolute path (open_clip's `local-dir:/...`, argv `--x=/...`).
_PATH_VALUE = re.compile(r"^(?P<prefix>[\w.\-]*[:=])?(?P<path>/(?!/)[^\n]*)$")
_HUB_SNAPSHOT = re.compile(r"/(?:models|datasets|spaces)--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<rev>[0-9a-f]+)")
#: Which files of a folder are hashed in full: small configs, tokenizers and annotation lists.
#: Everything else (model weights, images: gigabytes) enters by name and size only, so naming a
#: COCO download or a real model stays cheap and still tells versions apart.
_HASH_FULL_BYTES = 1 << 20
_HASH_FULL_SUFFIXES = {".json", ".txt", ".yaml", ".yml", ".cfg", ".model", ".md"}


def git_state(root: Path = _PACKAGE_ROOT) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def content_digest(path: Path) -> str:
    """sha256 over a file, or over a folder's relative file names, sizes and small text contents.

    A symlink inside the folder enters by its name and link text, never followed: it may lead out
    of the folder (a COCO root's image linked to a private file), which is never read."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*"))
    for f in files:
        if f != path and f.is_symlink():
            h.update(f"{f.relative_to(path).as_posix()}\0->{os.readlink(f)}\0".encode())
            continue
        if not f.is_file():
            continue
        size = f.stat().st_size
        h.update(f"{f.relative_to(path).as_posix() if f != path else f.name}\0{size}\0".encode())
        if size <= _HASH_FULL_BYTES and (f == path or f.suffix in _HASH_FULL_SUFFIXES):
            h.update(f.read_bytes())
    return h.hexdigest()


def portable_path(path: str, root: Path, digests: dict[Path, str] | None = None) -> str:
    """One absolute path as described in the module docstring (`digests` memoises folder hashes)."""
    digests = {} if digests is None else digests
    p = Path(path)
    root = root.resolve()
    try:
        return p.resolve().relative_to(root).as_posix() or "."
    except ValueError:
        pass
    snapshot = _HUB_SNAPSHOT.search(path)
    if snapshot:
        return f"{snapshot['org']}/{snapshot['name']}@{snapshot['rev']}"
    if p.exists():
        if p not in digests:
            digests[p] = content_digest(p)
        return f"local:{p.name}@sha256:{digests[p][:16]}"
    return os.path.relpath(p, root)


def portable(value: Any, root: Path) -> Any:
    """`value` (JSON-like) with every absolute local path rewritten by `portable_path`: values that
    are a path, and the same paths where prose quotes them (a card sentence naming the model)."""
    names: dict[str, str] = {}
    digests: dict[Path, str] = {}  # a source folder is named in several places

    def collect(v: Any) -> None:
        if isinstance(v, dict):
            for item in v.values():
                collect(item)
        elif isinstance(v, (list, tuple)):
            for item in v:
                collect(item)
        elif isinstance(v, str):
            match = _PATH_VALUE.match(v)
            if match and match["path"] not in names:
                names[match["path"]] = portable_path(match["path"], root, digests)

    def rewrite(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: rewrite(item) for k, item in v.items()}
        if isinstance(v, (list, tuple)):
            return [rewrite(item) for item in v]
        if isinstance(v, str):
            match = _PATH_VALUE.match(v)
            if match:
                return (match["prefix"] or "") + names[match["path"]]
            for path in sorted(names, key=len, reverse=True):  # longest first: nested paths
                if path in v:
                    v = v.replace(path, names[path])
        return v

    collect(value)
    return rewrite(value)
