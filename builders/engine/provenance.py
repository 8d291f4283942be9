"""What a published manifest says about where a build came from, without leaking the machine.

- `git_state()`: the commit of the counterfactory checkout that ran the build, and whether its
  tracked files had uncommitted changes (None outside a git checkout, e.g. a wheel install).
- `code_version()`: that commit as one string, `git:COMMIT` or `git:COMMIT+dirty`; in an
  installed wheel (no checkout) the version and a digest of the installed package files,
  `VERSION+sha256:DIGEST`. `source_digest(module)`: a module's (or package's) own files.
  Caches and de-duplication keys use both, so a bug fix in a metric changes them.
- `model_name(spec)`: the one name every record (data rows, manifest, card, the trainer's
  run.json and model card, the MITL files) gives a model passed as `spec` (a flag value). What
  decides is what the spec resolves to, not how it is spelled:
  an existing local folder or file (absolute, relative to the working folder, `~/...`, or behind
  open_clip's `local-dir:`) → `local:NAME@sha256:DIGEST` of its contents (a Hugging Face cache
  snapshot folder → `ORG/NAME@REVISION`); a path-like spec that does not exist → `local:NAME`;
  anything else is a Hub id and stays one, `ORG/NAME@REVISION` when the local Hub cache holds a
  snapshot of it (`hf-hub:` and `open_clip:ARCH:TAG` keep their prefix, a local TAG named too).
- `portable(value, root, inputs)`: every absolute local path in a manifest becomes something
  meaningful elsewhere: a path inside the build → relative to it; anything else → as
  `model_name` names it (a local model, the NLTK tagger, a source folder); a path that does not
  exist → relative to the build. The given `inputs` (model specs, however spelled) get their
  `model_name` wherever a value is one (config, command line). Prose that quotes one of these
  paths or inputs (a card sentence naming the model) gets the same name. So no card, manifest or
  run record names the builder's home or temp directories.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Iterable

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: `prefix:` / `--flag=` before an absolute path (open_clip's `local-dir:/...`, argv `--x=/...`).
_PATH_VALUE = re.compile(r"^(?P<prefix>[\w.\-]*[:=])?(?P<path>/(?!/)[^\n]*)$")
#: `--flag=VALUE` in a recorded command line.
_FLAG_VALUE = re.compile(r"^(?P<flag>--[\w\-]+=)(?P<value>.+)$")
#: open_clip's loader prefixes: a value with one is a model spec, named as a whole.
_MODEL_PREFIXES = ("local-dir:", "hf-hub:")
_HUB_SNAPSHOT = re.compile(
    r"/(?:models|datasets|spaces)--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<rev>[0-9a-f]+)"
)
#: A Hub repo id (`NAME` or `ORG/NAME`), the only specs whose cached revision is looked up.
_REPO_ID = re.compile(r"[\w.\-]+(/[\w.\-]+)?")
#: A spec spelled as a path (absolute, `./`, `../`, `~`): never a Hub id, even when missing.
_PATH_LIKE = re.compile(r"^(/|\./|\.\./|~|\.$|\.\.$)")
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

    # Only the checkout that is the package itself: a wheel installed into a virtualenv that
    # lies inside some other git work tree must not report that tree's commit.
    top = git("rev-parse", "--show-toplevel")
    commit = git("rev-parse", "HEAD") if top and Path(top).resolve() == root.resolve() else None
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


#: The packages of the counterfactory distribution (pyproject's packages, top level).
_PACKAGES = ("builders", "counterfactory_metrics", "dataset_cards", "loading_scripts", "training")


@functools.cache
def code_version() -> str:
    """`git:COMMIT` (`+dirty` when tracked files had uncommitted changes) in a checkout; in an
    installed wheel `VERSION+sha256:DIGEST` of its installed package files (module docstring)."""
    state = git_state()
    if state["commit"] is not None:
        return f"git:{state['commit']}" + ("+dirty" if state["dirty"] else "")
    from builders import __version__

    digests = [source_digest(name) for name in _PACKAGES if importlib.util.find_spec(name)]
    return f"{__version__}+sha256:{hashlib.sha256(''.join(digests).encode()).hexdigest()[:16]}"


@functools.cache
def source_digest(module: str) -> str:
    """`sha256:` of a module's source file, or of every `.py`, `.md` and `.txt` file of a package
    (names and contents), found without running the module (its parent packages are imported)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not (spec.origin or spec.submodule_search_locations):
        raise ValueError(f"no module {module!r}")
    # A package's folder (also a namespace package's, which has no origin), else the file.
    locations = list(spec.submodule_search_locations or [])
    root = Path(locations[0]) if locations else Path(spec.origin)
    files = (
        sorted(p for p in root.rglob("*") if p.suffix in {".py", ".md", ".txt"} and "__pycache__" not in p.parts)
        if root.is_dir()
        else [root]
    )
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relative_to(root).as_posix() if f != root else f.name}\0".encode())
        h.update(f.read_bytes())
    return f"sha256:{h.hexdigest()[:16]}"


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


def hub_snapshot(repo_id: str) -> Path | None:
    """The locally cached snapshot folder of a Hub model (its name is the commit), if any."""
    if not _REPO_ID.fullmatch(repo_id):
        return None
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (OSError, ValueError):  # not cached, or not a valid Hub id: no revision to tell
        return None


def _local_name(path: Path, digests: dict[Path, str]) -> str:
    """A local file or folder: a Hub cache snapshot by its repo and revision, anything else by its
    name and the digest of its contents (just its name when it does not exist)."""
    exists = path.exists()
    # As spelled (a file in a snapshot is a link into blobs/) and as resolved (a link to a snapshot).
    for spelling in (os.path.abspath(path), *([str(path.resolve())] if exists else [])):
        snapshot = _HUB_SNAPSHOT.search(spelling)
        if snapshot:
            return f"{snapshot['org']}/{snapshot['name']}@{snapshot['rev']}"
    if not exists:
        return f"local:{Path(os.path.abspath(path)).name}"
    resolved = path.resolve()
    if resolved not in digests:
        digests[resolved] = content_digest(resolved)
    return f"local:{resolved.name}@sha256:{digests[resolved][:16]}"


def model_name(spec: str, digests: dict[Path, str] | None = None) -> str:
    """The provenance name of the model `spec` (module docstring); `digests` memoises hashes."""
    digests = {} if digests is None else digests
    prefix, _, rest = spec.partition(":")
    if prefix == "local-dir" and rest:  # open_clip's local folder: local:... says it already
        return model_name(rest, digests)
    if prefix == "hf-hub" and rest:
        named = model_name(rest, digests)
        return named if named.startswith("local:") else f"hf-hub:{named}"
    if prefix == "open_clip" and rest:  # ARCH[:TAG], where TAG may be a checkpoint file
        arch, _, tag = rest.partition(":")
        return f"open_clip:{arch}" + (f":{model_name(tag, digests)}" if tag else "")
    path = Path(spec).expanduser()
    if spec and (path.exists() or _PATH_LIKE.match(spec)):
        return _local_name(path, digests)
    snapshot = hub_snapshot(spec)
    return f"{spec}@{snapshot.name}" if snapshot else spec


def model_names(specs: dict[str, str | None]) -> dict[str, str | None]:
    """`model_name` of every role's spec (None stays None: a role the run did not use)."""
    digests: dict[Path, str] = {}
    return {role: model_name(spec, digests) if spec else spec for role, spec in specs.items()}


def portable_path(path: str, root: Path, digests: dict[Path, str] | None = None) -> str:
    """One absolute path as described in the module docstring (`digests` memoises folder hashes)."""
    digests = {} if digests is None else digests
    p = Path(path)
    try:
        return p.resolve().relative_to(root.resolve()).as_posix() or "."
    except ValueError:
        pass
    if p.exists() or _HUB_SNAPSHOT.search(path):
        return model_name(path, digests)
    return os.path.relpath(p, root)


def portable(value: Any, root: Path, inputs: Iterable[str | None] = ()) -> Any:
    """`value` (JSON-like) with every absolute local path rewritten by `portable_path`, and every
    value that is one of `inputs` (model specs, a local dataset folder; however spelled:
    `models/sd` too) by `model_name`: values that are a path or an input (also as
    `--flag=VALUE`), and the same paths and inputs where prose quotes them (a card sentence
    naming the model)."""
    names: dict[str, str] = {}
    digests: dict[Path, str] = {}  # a source folder is named in several places
    specs = {m: model_name(m, digests) for m in inputs if m}
    # Prose quotes a spec as a whole word: `models/sd` is not replaced inside `models/sd_v2`.
    quoted = [
        (re.compile(rf"(?<![\w./~-]){re.escape(spec)}(?![\w/-]|\.\w)"), name)
        for spec, name in sorted(specs.items(), key=lambda kv: -len(kv[0]))
        if spec != name
    ]

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

    def rewrite_text(v: str) -> str:
        if v in specs:
            return specs[v]
        flag = _FLAG_VALUE.match(v)
        if flag and flag["value"] in specs:
            return flag["flag"] + specs[flag["value"]]
        match = _PATH_VALUE.match(v)
        if match:
            if match["prefix"] in _MODEL_PREFIXES:  # open_clip's loader prefixes: a model spec
                return model_name(v, digests)
            return (match["prefix"] or "") + names[match["path"]]
        for path in sorted(names, key=len, reverse=True):  # longest first: nested paths
            if path in v:
                v = v.replace(path, names[path])
        for pattern, name in quoted:
            v = pattern.sub(name, v)
        return v

    def rewrite(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: rewrite(item) for k, item in v.items()}
        if isinstance(v, (list, tuple)):
            return [rewrite(item) for item in v]
        return rewrite_text(v) if isinstance(v, str) else v

    collect(value)
    return rewrite(value)
