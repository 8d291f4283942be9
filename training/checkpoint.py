"""Checkpoints, resume, the final model's card, and `--push-to-hub` (of the files the run wrote).

A checkpoint is `OUTPUT/checkpoints/step-NNNNNNNN/`: the model, optimizer, scheduler and RNG
states in files nothing unpickles (training/checkpoint_files.py: not accelerate's `save_state`,
whose pickled scheduler ran code on `--resume`), plus `trainer_state.json` (epoch, next batch in
that epoch, step, best validation loss, and the run's training fingerprint), written last, so a
folder without it is an interrupted save and is ignored. `--resume latest` takes the newest
complete one; the batch order is a function of (seed, epoch), so the resumed run continues with
the same data order. A checkpoint of another training configuration (training/config.py
`training_fingerprint`: another --lr, seed, dataset, model, ...) is refused in one line naming
the flags that differ (`check_same_training`), before anything is written.
"""

from __future__ import annotations

import json
import logging
import re
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from builders.engine.errors import InputFileError, OutputError, PublishError, UserFacingError
from builders.engine.plain_text import code_span
from builders.publishing.hub_client import hub_errors, use_endpoint
from training.checkpoint_files import Resumable, check_files, read_all, write_rng, write_shared, written_by_trainer
from training.final_files import opened_published
from training.run_root import RunRoot
from training.report.markdown import natural, plain, ranking, with_interval

log = logging.getLogger(__name__)
STATE_FILE = "trainer_state.json"


@dataclass
class TrainerState:
    epoch: int = 0
    #: The next batch of `epoch` to train on.
    batch: int = 0
    step: int = 0
    best_val_loss: float | None = None
    #: The run's `training_fingerprint` (`--flag` -> value); None in a checkpoint written before
    #: checkpoints recorded it (refused on --resume: it cannot be checked).
    config: dict | None = None


def checkpoint_dir(step: int) -> str:
    """The checkpoint folder of `step`, relative to the run folder."""
    return f"checkpoints/step-{step:08d}"


def save_checkpoint(
    accelerator, root: RunRoot, state: TrainerState, pieces: Resumable, keep: int | None = None
) -> Path:
    """Save the state at `state.step`; with `keep` (--keep-checkpoints), then delete all but the
    newest `keep` complete checkpoints (and interrupted saves older than them). Every file is
    written and deleted below the run folder's descriptor (training/run_root.py), never through
    a link."""
    rel = checkpoint_dir(state.step)
    if accelerator.is_main_process:
        # An interrupted save of this step (or a checkpoint of a run resumed before it) goes
        # first: a stale file would make the folder refused on --resume.
        _remove_checkpoints(root, [rel])
    accelerator.wait_for_everyone()
    with root.at(rel, create=True) as path:  # by every process: other machines' disks too
        if accelerator.is_main_process:
            write_shared(path, pieces)
        write_rng(path, accelerator.process_index)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        root.write_text(f"{rel}/{STATE_FILE}", json.dumps(asdict(state)))
        if keep is not None:
            _prune_checkpoints(root, keep)
    accelerator.wait_for_everyone()
    return root.path(rel)


def _prune_checkpoints(root: RunRoot, keep: int) -> None:
    dirs, _, links = root.entries("checkpoints")
    folders = sorted(f"checkpoints/{name}" for name in dirs + links if name.startswith("step-"))
    complete = [rel for rel in folders if _is_file(root, f"{rel}/{STATE_FILE}")]
    if len(complete) <= keep:
        return
    oldest_kept = complete[-keep]
    _remove_checkpoints(root, [rel for rel in folders if rel < oldest_kept])
    log.info("--keep-checkpoints %d: removed the checkpoints before %s", keep, root.path(oldest_kept))


def _is_file(root: RunRoot, rel: str) -> bool:
    info = root.lstat(rel)
    return info is not None and stat.S_ISREG(info.st_mode)


def _remove_checkpoints(root: RunRoot, folders: list[str]) -> None:
    """Delete checkpoint folders that hold only files the trainer writes into a checkpoint (its
    file names, plain files); any other entry (a file put there, a symlink, a folder) is refused
    in one line naming it, before any folder is deleted (builders/engine/owned_files.py's rule).
    Checked, then deleted relative to the run folder's descriptor: a folder swapped for a link
    after the check is refused at the act (`LinkRefused`), and nothing outside is deleted."""
    for rel in folders:
        _check_checkpoint(root, rel)
    for rel in folders:
        if root.lstat(rel) is not None:
            root.remove_tree(rel)


def _check_checkpoint(root: RunRoot, rel: str) -> None:
    """Refuse a checkpoint folder holding anything the trainer does not write there (a folder
    that is a link is refused by `entries`)."""
    if root.lstat(rel) is None:
        return
    dirs, files, links = root.entries(rel)
    for name in sorted(dirs + links + files):
        if name not in files or not written_by_trainer(name):
            raise OutputError(
                f"{root.path(rel) / name}: not a file the trainer writes into a checkpoint, so its folder is not "
                "deleted (nothing was); move it out, then re-run the same command with --resume latest"
            )


def find_checkpoint(output: Path, resume: str, fp16: bool = False) -> Path | None:
    """`latest` -> newest complete checkpoint (None if there is none yet); else a folder. Its
    files are checked (checkpoint_files.check_files) before the run writes anything: a file the
    trainer does not write, or a missing one, is refused in one line."""
    if resume != "latest":
        path = Path(resume)
        if not (path / STATE_FILE).is_file():
            raise UserFacingError(
                f"--resume {resume}: no {STATE_FILE} there; give a checkpoint "
                f"folder under {output / 'checkpoints'} or `latest`"
            )
    else:
        done = sorted(p for p in (output / "checkpoints").glob("step-*") if (p / STATE_FILE).is_file())
        if not done:
            return None
        path = done[-1]
    check_files(path, fp16)
    return path


def load_checkpoint(accelerator, path: Path, pieces: Resumable) -> TrainerState:
    """Restore `pieces` from the folder `find_checkpoint` gave and return the trainer's counters.
    Only the files the trainer writes are opened, each with a reader that runs no code."""
    state = _read_state(path / STATE_FILE)
    read_all(path, pieces, accelerator.process_index)
    return state


def _read_state(path: Path) -> TrainerState:
    try:
        saved = json.loads(path.read_text())
        state = TrainerState(**saved)
    # ValueError: also an integer of more digits than Python converts (json.loads raises it).
    except (OSError, UnicodeDecodeError, ValueError, TypeError) as err:
        raise InputFileError(
            path,
            f"--resume: not a trainer state ({' '.join(str(err).split())[:200]})",
            "give a checkpoint folder that `counterfactory train` wrote",
        ) from None
    counters = (state.epoch, state.batch, state.step)
    if (
        not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counters)
        or not (state.best_val_loss is None or isinstance(state.best_val_loss, (int, float)))
        or not (state.config is None or isinstance(state.config, dict))
    ):
        raise InputFileError(
            path,
            f"--resume: not a trainer state ({str(saved)[:200]})",
            "give a checkpoint folder that `counterfactory train` wrote",
        )
    # The folder is named for the step it saved (checkpoint_dir): a state of another step was
    # edited or moved, and a step beyond the run's would resume into training nothing.
    named = re.fullmatch(r"step-(\d+)", path.parent.name)
    if named is None or int(named.group(1)) != state.step:
        raise InputFileError(
            path,
            f"--resume: it records step {_value(state.step)}, but its folder is named {path.parent.name!r}",
            "give a checkpoint folder that `counterfactory train` wrote, as it named it",
        )
    return state


def check_resume_step(path: Path | None, total: int, steps_per_epoch: int, accum: int) -> None:
    """The checkpoint `path` (if resuming one) lies within this run: its step at most the run's
    last step `total` (--max-steps, --epochs), and its epoch and batch (in batches of `accum` per
    step) not past its step. A checkpoint beyond them would resume into training nothing, then
    write a final record and final/ as if it had. One line naming the file, before anything is
    written."""
    if path is None:
        return
    where = path / STATE_FILE
    state = _read_state(where)
    step = _value(state.step)
    if state.step > total:
        raise InputFileError(
            where,
            f"--resume: the checkpoint is at step {step}, past this run's last step {total} "
            "(--max-steps, or --epochs x the steps per epoch), so it would train nothing",
            f"give --max-steps and --epochs that reach step {step}, or resume an earlier checkpoint",
        )
    if state.epoch * steps_per_epoch + state.batch // accum > state.step:
        raise InputFileError(
            where,
            f"--resume: epoch {_value(state.epoch)}, batch {_value(state.batch)} lie past its step {step} "
            f"({steps_per_epoch} steps of {accum} batches per epoch)",
            "give a checkpoint folder that `counterfactory train` wrote",
        )


def read_fingerprint(path: Path) -> dict | None:
    """The training fingerprint a checkpoint (its trainer_state.json) records."""
    return _read_state(path / STATE_FILE).config


def check_same_training(where: Path, saved: dict | None, current: dict) -> None:
    """Refuse to resume from `where` (a checkpoint, or the run.json of a run that saved none)
    when it records another training fingerprint than this run's: one line naming the flags."""
    fix = (
        "resume with the flags of the run that wrote it, or train into another --output "
        "(or --overwrite-output-dir to replace that run)"
    )
    if saved is None:
        raise InputFileError(
            where,
            "--resume: it records no training configuration (written by an "
            "earlier version), so it cannot be checked against this run's "
            "flags",
            fix,
        )
    differ = [k for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]
    if differ:
        shown = "; ".join(f"{k} {_value(saved.get(k))} there, {_value(current.get(k))} here" for k in differ[:5])
        more = f"; and {len(differ) - 5} more" if len(differ) > 5 else ""
        raise InputFileError(where, f"--resume: a run of another training configuration ({shown}{more})", fix)


def _value(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def metric_table(
    metrics: dict[str, float],
    intervals: dict[str, tuple[float, float]] | None = None,
    notes: dict[str, str] | None = None,
) -> str:
    """The Markdown table of metrics.md and the model card, each value with its 95 % interval
    when `intervals` has one, else with why it has none when `notes` says (as the model report
    shows them); a metric name comes from data (a `--zeroshot` folder's name), so it is shown as
    plain text, as in the model report."""
    intervals, notes = intervals or {}, notes or {}
    rows = "\n".join(
        f"| {plain(k)} | {with_interval(v, *intervals.get(k, (None, None)), notes.get(k))} |"
        for k, v in sorted(metrics.items(), key=lambda kv: natural(kv[0]))
    )
    return f"| metric | value |\n|---|---|\n{rows}\n"


def final_tables(record: dict, metrics: dict[str, float]) -> str:
    """metrics.md's and the model card's evaluation: the final metrics (with the intervals of
    `record["final_intervals"]`, or why none: `final_interval_notes`) and, when the base model
    was evaluated before step 1, before -> after (`record["before_after"]`); the metrics of a
    set that overlaps training (`eval_overlap`) marked, their intervals and notes alike; how a
    cross-encoder ranked (`retrieval`, the benchmark's words) and its PN's s (`necessity`) above them."""
    from training.before_after import before_after_table
    from training.leakage import mark_overlapping

    overlap = record.get("eval_overlap", {})
    intervals = {k: tuple(v) for k, v in (record.get("final_intervals") or {}).items()}
    notes = record.get("final_interval_notes") or {}
    table = metric_table(*(mark_overlapping(d, overlap) for d in (metrics, intervals, notes)))
    change = before_after_table(record.get("before_after") or {}, overlap)
    if record.get("retrieval"):
        fixed = "; the first stage is not trained" if record.get("first_stage") else ""
        table = f"Retrieval metrics{ranking(record)}{fixed}.\n\n{table}"
    s_kind = (record.get("necessity") or {}).get("s_kind")
    if s_kind and any(name.startswith("necessity/") for name in metrics):
        table = f"Object necessity PN's s: {plain(s_kind)}.\n\n{table}"
    return table + (f"\n## Before -> after (the base model evaluated before step 1)\n\n{change}" if change else "")


_FAMILY_TITLES = {"blip_itc_itm": "BLIP", "bridgetower_itm": "BridgeTower"}
#: What each cross-encoder objective leaves out of its reference, and why (training/itm_objectives.py).
_LEFT_OUT = {
    "blip_itc_itm": (
        "BLIP's retrieval finetuning (Li et al. 2022, `train_retrieval.py`): ITC on the gathered batch "
        "plus ITM with one hard negative text per image and one hard negative image per text, drawn "
        "from the ITC similarities by softmax weight with the positives zeroed. Left out: BLIP's "
        "momentum encoder, its queue of momentum features and momentum distillation, and its learnt "
        "temperature (fixed at its initial 0.07): transformers' `BlipForImageTextRetrieval`, the "
        "class saved here, holds none of them."
    ),
    "bridgetower_itm": (
        "Image-text matching with in-batch hard negatives (BridgeTowerForImageAndTextRetrieval has "
        "only an ITM head): one negative text per image and one negative image per text, drawn by "
        "softmax weight of the model's own match scores of every in-batch pair, positives zeroed. "
        "COCO-Counterfactuals publishes no BridgeTower training script (docs/training.md)."
    ),
}


def objective_section(objective: dict | None) -> str:
    """A cross-encoder's objective, its terms' weights and what it leaves out (none for CLIP)."""
    if objective is None:
        return ""
    weights = ", ".join(f"{k} x {v}" for k, v in objective["weights"].items())
    return f"""
## Objective

`{objective["name"]}`: loss = {weights}. {_LEFT_OUT.get(objective["name"], "")}
"""


def model_card(run_record: dict, metrics: dict[str, float]) -> str:
    """The final model's README.md: base model, data, optimisation and `final_tables`."""
    # Dataset paths, splits and model names are the user's or the data's text: plain text.
    data_rows = "\n".join(
        f"| {plain(r['path'])} | {plain(r['revision'] or '(local folder)')} | {plain(r['commit'] or '-')} | "
        f"{plain(r['config'])}/{plain(r['split'])} | {r['rows']} |"
        for r in run_record["tables"]
    )
    cfg = run_record["config"]
    recipe = cfg.get("recipe") or "custom"
    tag = cfg["run"]["pretrained"]
    base = code_span(cfg["run"]["model"]) + (f", weights {code_span(tag)}" if tag else "")
    test = run_record.get("test_examples")
    held_out = f"; held out for the ITM deltas: {test}" if test else ""
    objective = run_record.get("objective")
    return f"""---
library_name: {"open_clip" if cfg["run"]["backend"] == "open_clip" else "transformers"}
tags:
- {"clip" if objective is None else objective["name"].split("_")[0]}
- counterfactory
- spurious-correlations
---

# {"CLIP" if objective is None else _FAMILY_TITLES.get(objective["name"], "Model")} finetuned with counterfactory

Base model: {base} ({cfg["run"]["backend"]}). Mixture: `{cfg["data"]["mix"]}`
(ratio {cfg["data"]["ratio"]}, data seed {cfg["data"]["data_seed"]}), hard negatives:
`{cfg["data"]["hard_negatives"]}`, recipe: `{recipe}`, seed {cfg["run"]["seed"]}.

## Training data

| dataset | revision | commit | config/split | rows read |
|---|---|---|---|---|
{data_rows}

Examples trained on: {run_record["train_examples"]}; validation: {run_record["validation_examples"]}{held_out}.

## Optimisation

```json
{json.dumps(cfg["optim"], indent=1)}
```
{objective_section(objective)}
## Evaluation (final model)

{final_tables(run_record, metrics)}
"""


def push_to_hub(folder: Path, repo_id: str, manifest: Path) -> str:
    """Upload exactly the files of `folder` (OUTPUT/final) that `manifest` lists, after every
    local check (training/final_files.py); the commit id. The same commit deletes every other
    file of the repo: after a second push to a repo the repo is this model, not this model plus
    the files of an earlier one (a stale `pytorch_model.bin` or open_clip checkpoint beside the
    new weights would be loaded by whoever prefers that format)."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    endpoint = use_endpoint(None)
    api = HfApi(endpoint=endpoint)
    try:
        # Checked and opened before any request (a refused folder sends nothing); the bytes sent
        # are those of the files opened, never read again by path.
        with (
            opened_published(folder, manifest) as files,
            hub_errors(endpoint, repo_id, "re-run the same command with --resume latest"),
        ):
            api.create_repo(repo_id, repo_type="model", exist_ok=True)
            stale = set(api.list_repo_files(repo_id, repo_type="model")) - set(files) - {".gitattributes"}
            info = api.create_commit(
                repo_id,
                repo_type="model",
                commit_message="counterfactory finetuned CLIP",
                operations=[CommitOperationAdd(rel, fh) for rel, fh in files.items()]
                + [CommitOperationDelete(rel) for rel in sorted(stale)],
            )
    except PublishError as err:
        raise PublishError(f"--push-to-hub {repo_id}: {err}") from None
    log.info("pushed the %d files of %s to %s (%d earlier files deleted)", len(files), folder, repo_id, len(stale))
    return info.oid
