"""The files a run wrote to `OUTPUT/final/`: the only ones `--push-to-hub` sends.

`finish` saves the final model and its card into a fresh staging folder (`OUTPUT/final.tmp`),
then moves each file into `final/` — replacing a file or symlink of that name there, never
writing through it — and records them in `OUTPUT/final_manifest.json` with their size and
sha256. The push sends exactly the listed files, after checking that `final/` holds nothing else:
a symlink (to a secret or not), a dotfile such as `.env`, a stray file, or a listed file that is
missing or changed stops it with one line naming them, before any request reaches the Hub — the
rule of the dataset publish (builders/engine/sharding/build_files.py). Files of `final/` that the
run did not write are never deleted either: the user decides what they are.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from builders.engine.errors import OutputError, UserFacingError
from builders.engine.no_follow import LinkRefused, RootDir
from builders.engine.owned_files import refuse, unowned
from builders.engine.repo_paths import repo_path_problem
from builders.engine.sharding.build_files import file_record, file_sha256

MANIFEST = "final_manifest.json"
STAGING = "final.tmp"
_NAMED = 5  # how many offending paths one error line names


def _walk(root: Path) -> tuple[list[str], list[str]]:
    """(files, symlinks) under `root` as relative POSIX paths; symlinks are not followed."""
    files, links = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in sorted(dirnames) + sorted(filenames):
            rel = (here / name).relative_to(root).as_posix()
            if (here / name).is_symlink():
                links.append(rel)
            elif name in filenames:
                files.append(rel)
        dirnames[:] = sorted(d for d in dirnames if not (here / d).is_symlink())
    return files, links


def _names(paths: list[str]) -> str:
    more = f" and {len(paths) - _NAMED} more" if len(paths) > _NAMED else ""
    return ", ".join(paths[:_NAMED]) + more


def fresh_staging(root: RootDir) -> Path:
    """An empty `OUTPUT/final.tmp` (a leftover of a run killed before its finish is removed:
    the name is the run's own, inside the folder this run holds the lock of), made below the run
    folder's descriptor."""
    info = root.lstat(STAGING)
    if info is not None and stat.S_ISDIR(info.st_mode):
        root.remove_tree(STAGING)
    elif info is not None:
        root.unlink(STAGING)
    os.close(root.folder(STAGING, create=True))
    return root.path(STAGING)


def _tree(root: RootDir, rel: str) -> tuple[list[str], list[str]]:
    """(files, symlinks) below the folder `rel` of `root`, relative to it; links not followed."""
    files, links = [], []
    for here, _, names, linked in root.walk(rel):
        inner = here.relative_to(rel)
        files += [(inner / n).as_posix() for n in names]
        links += [(inner / n).as_posix() for n in linked]
    return sorted(files), sorted(links)


def copy_saved_model(root: RootDir, src: str, dst: str) -> None:
    """Copy a model folder the run saved (`best/`) as regular files, both folders below the run
    folder's descriptor; a symlink there is refused."""
    files, links = _tree(root, src)
    if links:
        raise UserFacingError(
            f"{root.path(src)} holds symlink(s) {_names(links)}, which the run did not save; "
            "remove them and re-run the same command with --resume latest"
        )
    for rel in files:
        with root.open(f"{src}/{rel}", "rb") as fin, root.open(f"{dst}/{rel}", "wb", create_folders=True) as fout:
            shutil.copyfileobj(fin, fout)


def listed_files(manifest_path: Path) -> dict[str, dict]:
    """Path -> `{"path", "bytes", "sha256"}` of the files of `final/` the run recorded (checked:
    plain relative paths, no dotfiles)."""
    if not manifest_path.is_file() or manifest_path.is_symlink():
        raise UserFacingError(
            f"{manifest_path} is missing: the files in {manifest_path.parent / 'final'} "
            "were not recorded by a run; re-run the training (--resume latest) "
            "to write the final model again"
        )
    try:
        entries = json.loads(manifest_path.read_text())["files"]
        records = {e["path"]: e for e in entries}
    except (ValueError, KeyError, TypeError) as err:
        raise UserFacingError(
            f"{manifest_path} is damaged ({type(err).__name__}); re-run the "
            "training (--resume latest) to write it again"
        ) from None
    for path in records:
        problem = repo_path_problem(path) if isinstance(path, str) else "not a path"
        if not problem and any(part.startswith(".") for part in path.split("/")):
            problem = "a dotfile"
        if problem:
            raise UserFacingError(
                f"{manifest_path} lists {str(path)[:100]!r} ({problem}); it was "
                "edited or damaged — re-run the training (--resume latest)"
            )
    return records


def _foreign(final: Path, listed: set[str]) -> list[str]:
    files, links = _walk(final)
    return [f"symlink {p}" for p in links] + [p for p in files if p not in listed]


def _refuse_foreign(final: Path, found: list[str]) -> None:
    if found:
        raise UserFacingError(
            f"{final} holds {len(found)} file(s) the run did not write: {_names(found)}; "
            f"--push-to-hub sends only the files {MANIFEST} lists and refuses a folder holding "
            "anything else — move them out of it"
        )


def check_before_training(output: Path) -> None:
    """With `--push-to-hub`: refuse, before any step, a `final/` that already holds files an
    earlier run did not write (its own listed files are rewritten by this run)."""
    final = output / "final"
    if final.is_symlink():
        raise OutputError(
            f"{final} is a symlink; the final model is written into a real folder there — remove the link"
        )
    if not final.is_dir():
        return
    listed = set(listed_files(output / MANIFEST)) if (output / MANIFEST).exists() else set()
    _refuse_foreign(final, _foreign(final, listed))


def check_final_unchanged(output: Path, flag: str) -> None:
    """Refuse, before anything is written, a `final/` whose files a run would replace or delete
    (`install`) but which are not the ones `final_manifest.json` lists with their current sha256:
    a file the user added or edited there (`owned_files`)."""
    final = output / "final"
    if not final.is_dir() or final.is_symlink():
        return
    files, links = _walk(final)
    listed = listed_files(output / MANIFEST) if (output / MANIFEST).exists() else {}
    refuse(flag, final, [f"symlink {p}" for p in links] + unowned(final, files, listed), MANIFEST)


def install(root: RootDir) -> None:
    """Move the staged files (`final.tmp/`) into `final/`, delete the files the previous run
    listed that this one did not write, and record the new list, every move and deletion below
    the run folder's descriptor (a link on the way is refused, never followed). A file it would
    replace or delete that the previous run did not write as it is now is refused first, naming
    it (`owned_files`)."""
    final, staged = root.path("final"), root.path(STAGING)
    kept = f"(this run's model is in {staged})"
    info = root.lstat("final")
    if info is not None and stat.S_ISLNK(info.st_mode):
        raise OutputError(
            f"{final} is a symlink; the final model is written into a real folder there — remove the link {kept}"
        )
    files, links = _tree(root, STAGING)
    if links:  # nothing the run writes is a link: refuse rather than publish one
        raise UserFacingError(f"{staged} holds symlink(s) {_names(links)}; re-run the training")
    previous = listed_files(root.path(MANIFEST)) if root.lstat(MANIFEST) is not None else {}
    replaced = []
    for rel in sorted({*files, *previous}):
        try:
            if root.lstat(f"final/{rel}") is not None:
                replaced.append(rel)
        except LinkRefused:
            raise OutputError(
                f"{final / rel} leads outside {final} (a symlinked folder); remove the link {kept}"
            ) from None
    found = unowned(final, replaced, previous)
    if found:
        raise OutputError(
            f"{final} holds {len(found)} file(s) this run would replace that {MANIFEST} does not list "
            f"with their current sha256: {_names(found)}; nothing was replaced — move them out {kept}"
        )
    records = [file_record(staged, rel) for rel in files]
    os.close(root.folder("final", create=True))
    for rel in files:  # replaces a link of that name itself, never its target
        root.replace(f"{STAGING}/{rel}", f"final/{rel}")
    for rel in set(previous) - set(files):
        old = root.lstat(f"final/{rel}")
        if old is not None and stat.S_ISREG(old.st_mode):
            root.unlink(f"final/{rel}")
    root.write_atomic(MANIFEST, json.dumps({"files": records}, indent=1).encode())
    root.remove_tree(STAGING)


def published_files(final: Path, manifest_path: Path) -> list[str]:
    """The files `--push-to-hub` sends, after checking `final/` holds exactly what the run wrote:
    one line naming every symlink and unlisted file, or the first listed file missing or changed."""
    if final.is_symlink():
        raise UserFacingError(f"{final} is a symlink; --push-to-hub sends only the folder the run wrote")
    records = listed_files(manifest_path)
    _refuse_foreign(final, _foreign(final, set(records)))
    for rel in records:
        path = final / rel
        try:
            info = path.lstat()
            regular = stat.S_ISREG(info.st_mode) and path.resolve() == final.resolve() / rel
        except OSError:
            regular = False
        if not regular or info.st_size != records[rel].get("bytes") or file_sha256(path) != records[rel].get("sha256"):
            raise UserFacingError(
                f"{path} is missing or changed since the run wrote it (its size "
                f"or sha256 differs from {MANIFEST}); re-run the training "
                "(--resume latest) to write the final model again"
            )
    return list(records)


@contextmanager
def opened_published(final: Path, manifest_path: Path) -> Iterator[dict[str, BinaryIO]]:
    """The files `published_files` allows, each opened once below the run folder's descriptor
    (a link anywhere on its path refused, never followed) and checked again from what was opened:
    the bytes the push sends are the listed ones, whatever is swapped in after the check."""
    records = listed_files(manifest_path)
    files = published_files(final, manifest_path)
    with RootDir(final.parent) as root, ExitStack() as stack:
        opened = {}
        for rel in files:
            fh = stack.enter_context(root.open(f"{final.name}/{rel}", "rb"))
            if hashlib.file_digest(fh, "sha256").hexdigest() != records[rel].get("sha256"):
                raise UserFacingError(
                    f"{final / rel} changed since it was checked (its sha256 differs from {MANIFEST}); re-run "
                    "the training (--resume latest) to write the final model again"
                )
            fh.seek(0)
            opened[rel] = fh
        yield opened
