"""The run folder (`--output`): a run never silently replaces or continues another one.

What a run writes there: `run.json`, `loss.jsonl`, `metrics.jsonl`, `metrics.md`,
`embeddings.npz`, the base model's `before.json` and `embeddings_before.npz`
(training/before_after.py), `final/` (the files `final_manifest.json` lists) and `final_manifest.json`,
`best/` (--best-by-val-loss), `checkpoints/step-N/` (training/checkpoint_files.py), `logs/` (the
trackers), `final.tmp/` and `*.tmp` (interrupted writes), and `.parts/` (the lock,
builders/engine/sharding/output_guard.py).

A run into a folder holding anything but `.parts/` and `logs/` (what a run refused by its input
checks leaves: the lock, and the trackers' folder, opened before those checks) is refused in one
line before anything is written (as run_clip's `--overwrite_output_dir`: a second command would overwrite `final/`, the
metrics and `run.json`, and leave the other run's checkpoints for a later `--resume latest`),
unless
- `--resume`: it continues the run there, whose checkpoint, or `run.json` when it saved none
  yet, must record the same training configuration (training/checkpoint.py
  `check_same_training`); or
- `--overwrite-output-dir`: the earlier run's files above are deleted first, and only they: a
  folder holding anything else (a file the trainer does not write, a symlink, a file of
  `final/` that `final_manifest.json` does not list) is refused, deleting nothing, as a build's
  `--overwrite` is (builders/engine/sharding/build_files.py `discard_build`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from builders.engine.errors import OutputError, UserFacingError
from builders.engine.sharding.build_files import folder_contents
from builders.engine.sharding.layout import PARTS_DIR
from training.before_after import BEFORE_EMBEDDINGS, BEFORE_METRICS
from training.checkpoint import STATE_FILE, check_same_training, find_checkpoint, read_fingerprint
from training.checkpoint_files import CHECKPOINT_FILES, RNG
from training.config import TrainConfig, training_fingerprint
from training.final_files import MANIFEST, listed_files

log = logging.getLogger(__name__)

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
}
#: Folders whose whole contents are the run's (a backend's saved model, the trackers' logs, the
#: staging of final/).
RUN_FOLDERS = {"best", "logs", "final.tmp"}
#: What a run refused by its input checks leaves (not a run: a new one may start there).
LEFTOVERS = {PARTS_DIR, "logs"}
CHECKPOINT = "checkpoints/step-"
_NAMED = 5  # how many paths one error line names


def check_run_folder(cfg: TrainConfig, output: Path, fingerprint: dict) -> None:
    """Refuse, before anything is written: a non-empty `output` without --resume or
    --overwrite-output-dir; a --resume of another training configuration; an
    --overwrite-output-dir folder holding files the trainer does not write. Read-only (every
    process runs it)."""
    if cfg.run.resume:
        check_resumable(cfg, output, fingerprint)
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


def _owned(rel: str, listed: set[str]) -> bool:
    top = rel.split("/", 1)[0]
    if "/" not in rel:
        return rel in RUN_FILES or rel.endswith(".tmp")
    if top in RUN_FOLDERS:
        return True
    if top == "final":
        return rel.split("/", 1)[1] in listed
    parts = rel.split("/")
    return (
        rel.startswith(CHECKPOINT)
        and len(parts) == 3
        and parts[1][len("step-") :].isdigit()
        and (parts[2] in CHECKPOINT_FILES or parts[2] == STATE_FILE + ".tmp" or RNG.fullmatch(parts[2]) is not None)
    )


def run_files(output: Path) -> list[str]:
    """The files of the earlier run in `output` (relative paths, `.parts/` aside); one line
    naming the others when it holds any."""
    listed: set[str] = set()
    if (output / MANIFEST).is_file():
        try:
            listed = set(listed_files(output / MANIFEST))
        except UserFacingError:
            pass  # a damaged manifest names nothing: final/'s files are then not known to be ours
    files, links = folder_contents(output)
    foreign = [f"symlink {p}" for p in links] + [p for p in files if not _owned(p, listed)]
    if foreign:
        more = f" and {len(foreign) - _NAMED} more" if len(foreign) > _NAMED else ""
        raise OutputError(
            f"--overwrite-output-dir: {output} holds {len(foreign)} file(s) that no run wrote: "
            f"{', '.join(foreign[:_NAMED])}{more}; nothing was deleted — move them out of the folder "
            "(or delete them), or give a new --output"
        )
    return files


def clear_run_folder(output: Path) -> None:
    """--overwrite-output-dir: delete the earlier run's files (checked again: the main process,
    holding the folder's lock), then its emptied folders; `.parts/` (the lock) stays."""
    files = run_files(output)
    for rel in files:
        (output / rel).unlink()
    for dirpath, _, _ in sorted(os.walk(output), key=lambda w: -len(w[0])):
        here = Path(dirpath)
        if here != output and PARTS_DIR not in here.relative_to(output).parts and not any(here.iterdir()):
            here.rmdir()
    if files:
        log.info("--overwrite-output-dir: deleted the %d files of the earlier run in %s", len(files), output)
