"""The run folder (`--output`): a run never silently replaces or continues another one.

What a run writes there: `run.json`, `loss.jsonl`, `metrics.jsonl`, `metrics.md`,
`embeddings.npz`, the base model's `before.json` and `embeddings_before.npz`
(training/before_after.py), `final/` (the files `final_manifest.json` lists) and `final_manifest.json`,
`best/` (--best-by-val-loss), `checkpoints/step-N/` (training/checkpoint_files.py), `logs/` (the
trackers) and `logs_manifest.json`, `final.tmp/` and `*.tmp` (interrupted writes), and `.parts/`
(the lock, builders/engine/sharding/output_guard.py).

A run into a folder holding anything but `.parts/`, `logs/` and `logs_manifest.json` (what a run
refused by its input checks leaves: the lock, and the trackers' files, opened before those checks)
is refused in one line before anything is written (as run_clip's `--overwrite_output_dir`: a
second command would overwrite `final/`, the metrics and `run.json`, and leave the other run's
checkpoints for a later `--resume latest`), unless
- `--resume`: it continues the run there, whose checkpoint, or `run.json` when it saved none
  yet, must record the same training configuration (training/checkpoint.py
  `check_same_training`), and whose `final/` holds only the files `final_manifest.json` lists,
  unchanged (the finish replaces them); or
- `--overwrite-output-dir`: the earlier run's files above are deleted first, and only they: a
  folder holding anything else (a file the trainer does not write, a symlink, a file of
  `final/` or `logs/` that `final_manifest.json` or `logs_manifest.json` does not list with its
  current size and sha256: a user's note, a final README the user edited) is refused, deleting
  nothing, as a build's `--overwrite` is (builders/engine/owned_files.py).

Every branch first refuses, in one line naming them, the symlinks anywhere in the folder (#49: a
run would write or delete through them); then the run writes, renames and deletes there only
through the folder opened once (training/run_root.py `RunRoot`, relative to its descriptor).

The trackers' files are recorded when the run ends (`recorded_logs`): those written since the
start, and those recorded before that are unchanged. A run killed (kill -9) before it ends leaves
them unrecorded: `--overwrite-output-dir` then names them for the user to delete.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from builders.engine.errors import OutputError, UserFacingError
from builders.engine.owned_files import refuse, unowned
from builders.engine.sharding.build_files import file_record, folder_contents
from builders.engine.sharding.layout import PARTS_DIR
from training.before_after import BEFORE_EMBEDDINGS, BEFORE_METRICS
from training.checkpoint import STATE_FILE, check_same_training, find_checkpoint, read_fingerprint
from training.checkpoint_files import written_by_trainer
from training.config import TrainConfig, training_fingerprint
from training.final_files import MANIFEST, check_final_unchanged, listed_files
from training.run_root import RunRoot

log = logging.getLogger(__name__)

#: The files the trackers wrote under `logs/`, with their size and sha256 (`recorded_logs`).
LOGS_MANIFEST = "logs_manifest.json"

#: Files the trainer writes at the top of --output.
RUN_FILES = {
    "run.json",
    "loss.jsonl",
    "metrics.jsonl",
    "metrics.md",
    "embeddings.npz",
    BEFORE_METRICS,
    BEFORE_EMBEDDINGS,
    MANIFEST,
    LOGS_MANIFEST,
}
#: Folders whose whole contents are the run's (a backend's saved model, the staging of final/).
RUN_FOLDERS = {"best", "final.tmp"}
#: What a run refused by its input checks leaves (not a run: a new one may start there).
LEFTOVERS = {PARTS_DIR, "logs", LOGS_MANIFEST}
CHECKPOINT = "checkpoints/step-"
_NAMED = 5  # how many paths one error line names


def check_run_folder(cfg: TrainConfig, root: RunRoot, fingerprint: dict) -> None:
    """Refuse, before anything is written: a symlink anywhere in the run folder (#49: the run
    would write or delete through it; `final/`'s own checks name the links it holds); a non-empty
    folder without --resume or --overwrite-output-dir; a --resume of another training
    configuration; an --overwrite-output-dir folder holding files the trainer does not write.
    Read-only (every process runs it)."""
    output = root.root
    flag = "--resume" if cfg.run.resume else "--overwrite-output-dir" if cfg.run.overwrite_output_dir else "--output"
    root.refuse_links(flag, skip=("final",))  # `final` itself, a link, is named
    if cfg.run.resume:
        check_resumable(cfg, output, fingerprint)
        check_final_unchanged(output, "--resume")  # the finish replaces final/'s files
        return
    if cfg.run.overwrite_output_dir:
        run_files(output)  # raises on foreign files
        return
    # A run's record and results first: what the user would lose.
    held = sorted(
        (p.name for p in output.iterdir() if p.name not in LEFTOVERS),
        key=lambda name: (name not in ("run.json", "final", "checkpoints"), name),
    )
    if held:
        more = f" and {len(held) - _NAMED} more" if len(held) > _NAMED else ""
        raise OutputError(
            f"--output {output} is not empty (it holds {', '.join(held[:_NAMED])}{more}): "
            "pass --resume latest to continue the run there, --overwrite-output-dir "
            "to replace it, or give a new folder"
        )


def check_resumable(cfg: TrainConfig, output: Path, fingerprint: dict) -> None:
    """--resume: the checkpoint it names (or, when the run there saved none yet, its run.json)
    must record this run's training fingerprint."""
    found = find_checkpoint(output, cfg.run.resume, fp16=cfg.optim.mixed_precision == "fp16")
    if found is not None:
        check_same_training(found / STATE_FILE, read_fingerprint(found), fingerprint)
        return
    record = output / "run.json"
    if not record.exists():
        return  # nothing ran there yet
    try:
        saved = training_fingerprint(json.loads(record.read_text())["config"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        raise OutputError(
            f"{record}: --resume latest found no checkpoint and this is not a run "
            "record, so the run there cannot be checked against this one; "
            "--overwrite-output-dir replaces it, or give a new --output"
        ) from None
    check_same_training(record, saved, fingerprint)


def _owned_by_name(rel: str) -> bool:
    """The files the trainer writes whole under fixed names (the run's record, results, a saved
    model, a checkpoint's files), outside `final/` and `logs/`, which records list."""
    top = rel.split("/", 1)[0]
    if "/" not in rel:
        return rel in RUN_FILES or rel.endswith(".tmp")
    if top in RUN_FOLDERS:
        return True
    parts = rel.split("/")
    return (
        rel.startswith(CHECKPOINT)
        and len(parts) == 3
        and parts[1][len("step-") :].isdigit()
        and written_by_trainer(parts[2])
    )


def _records(output: Path) -> dict[str, dict]:
    """The files of `final/` and `logs/` the run recorded (by path under `output`), with their
    size and sha256; a damaged record lists nothing (its files are then not known to be ours)."""
    records: dict[str, dict] = {}
    for manifest, folder in ((MANIFEST, "final"), (LOGS_MANIFEST, "logs")):
        if (output / manifest).is_file():
            try:
                records.update({f"{folder}/{rel}": r for rel, r in listed_files(output / manifest).items()})
            except UserFacingError:
                pass
    return records


def run_files(output: Path) -> list[str]:
    """The files of the earlier run in `output` (relative paths, `.parts/` aside); one line
    naming the others when it holds any: a file no run writes, a symlink, a file of `final/` or
    `logs/` that their manifest does not list with its current sha256 (`owned_files`)."""
    files, links = folder_contents(output)
    recorded = [p for p in files if p.split("/", 1)[0] in ("final", "logs")]
    found = [f"symlink {p}" for p in links]
    found += [f"{p} (not written by a run)" for p in files if p not in recorded and not _owned_by_name(p)]
    found += unowned(output, recorded, _records(output))
    refuse("--overwrite-output-dir", output, found, f"{MANIFEST} or {LOGS_MANIFEST}")
    return files


def tracker_files(output: Path) -> set[str]:
    """The files under `logs/` now (relative to it): those a run's trackers write are the others."""
    files, links = folder_contents(output / "logs") if (output / "logs").is_dir() else ([], [])
    return set(files) | set(links)


@contextmanager
def recorded_logs(accelerator, root: RunRoot) -> Iterator[None]:
    """Around the run's trackers: when the run ends (finished or refused), close them and record
    in `logs_manifest.json` the files they wrote under `logs/` (new since the start, or listed
    before and unchanged), so `--overwrite-output-dir` deletes those and refuses any other."""
    before = tracker_files(root.root) if accelerator.is_main_process else set()
    try:
        yield
    finally:
        for tracker in accelerator.trackers:  # again after `end_training`: closing twice is a no-op
            tracker.finish()  # flushed and closed: the bytes recorded are the final ones
        if accelerator.is_main_process:
            _record_logs(root, before)


def _record_logs(root: RunRoot, before: set[str]) -> None:
    output = root.root
    logs = output / "logs"
    files, _ = folder_contents(logs) if logs.is_dir() else ([], [])
    previous = {rel.split("/", 1)[1]: r for rel, r in _records(output).items() if rel.startswith("logs/")}
    kept = [rel for rel in files if rel in previous and not unowned(logs, [rel], previous)]
    records = [previous[rel] for rel in kept] + [file_record(logs, rel) for rel in files if rel not in before]
    if records or root.lstat(LOGS_MANIFEST) is not None:
        root.write_text(LOGS_MANIFEST, json.dumps({"files": records}, indent=1))


def clear_run_folder(root: RunRoot) -> None:
    """--overwrite-output-dir: delete the earlier run's files (checked again: the main process,
    holding the folder's lock), then its emptied folders; `.parts/` (the lock) stays. Each
    deletion is relative to the run folder's descriptor, never through a link (#49): a folder
    swapped for a link after the check is refused at the act."""
    files = run_files(root.root)
    for rel in files:
        root.unlink(rel)
    _remove_empty_folders(root)
    if files:
        log.info("--overwrite-output-dir: deleted the %d files of the earlier run in %s", len(files), root.root)


def _remove_empty_folders(root: RunRoot) -> None:
    """The folders below the run folder left empty, deepest first (never `.parts/`)."""
    found = [here for here, _, _, _ in root.walk() if here.parts and here.parts[0] != PARTS_DIR]
    for here in sorted(found, key=lambda p: -len(p.parts)):
        with root.parent(here) as (fd, name):
            try:
                os.rmdir(name, dir_fd=fd)
            except OSError:  # not empty: it holds what was kept
                pass
