"""Embedding cache of `counterfactory benchmark`: one entry per (weights digest, dataset content,
metric code version and settings), so adding a model to a report encodes only that model.

An entry is the embeddings `evaluate_model` saved (`.npz`) and its metrics (`.json`, written last,
so an interrupted write is a miss, never a half entry). The JSON holds the full key, compared on
read: a short file name can never hand one model's numbers to another."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from pathlib import Path

from builders.engine.provenance import model_name
from builders.engine.sharding.build_files import file_sha256
from training.report.results import code_version

log = logging.getLogger(__name__)


def cache_key(digest: str, preprocessing: str, ds) -> dict:
    """What the cached numbers depend on: the weights and the preprocessing that feeds them (two
    folders with the same weights may resize or tokenize differently), every table read (a local
    build named by its contents, a Hub one by the commit its revision resolved to), the metric
    code and the evaluation settings that change a number (batch size and workers do not)."""
    tables = [[model_name(t.path) if t.commit is None else t.path, t.commit, t.config, t.split, t.rows]
              for t in ds.tables]
    instances = ds.cfg.run.coco_instances
    return {"weights_digest": digest, "preprocessing_digest": preprocessing, "dataset": ds.name,
            "tables": tables, "k_values": list(ds.cfg.run.k_values), "eccv": bool(ds.cfg.run.eccv),
            "pm_instances": _instances_digest(instances) if instances else None,
            "code_version": code_version()}


@functools.cache
def _instances_digest(path: str) -> str:
    # COCO's instances file is ~450 MB: hashed once per report, not per model x dataset.
    return file_sha256(Path(path))


def entry_paths(folder: Path, key: dict) -> tuple[Path, Path]:
    """The `.npz` and `.json` of `key`: named by dataset, weights and key digests, so a folder
    listing tells which model each file belongs to."""
    whole = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    stem = f"{key['dataset']}-{key['weights_digest'].removeprefix('sha256:')[:16]}-{whole}"
    return folder / f"{stem}.npz", folder / f"{stem}.json"


def read_entry(folder: Path, key: dict) -> tuple[Path, dict[str, float]] | None:
    """(embeddings file, metrics) of `key`, or None when not cached."""
    npz, meta = entry_paths(folder, key)
    if not (npz.is_file() and meta.is_file()):
        return None
    try:
        saved = json.loads(meta.read_text())
    except (OSError, json.JSONDecodeError):
        log.warning("embedding cache %s unreadable: recomputing it", meta)
        return None
    if saved.get("key") != key:
        return None
    return npz, saved["metrics"]


def write_entry(folder: Path, key: dict, npz_written: Path, metrics: dict[str, float]) -> Path:
    """Move the embeddings `evaluate_model` wrote to `npz_written` into the cache beside their
    metrics; the cached `.npz` path."""
    npz, meta = entry_paths(folder, key)
    os.replace(npz_written, npz)
    tmp = meta.with_suffix(".json.tmp")
    # NaN (an empty ITM group) round-trips through Python's json, as evaluate_model returns it.
    tmp.write_text(json.dumps({"key": key, "metrics": metrics}, sort_keys=True))
    os.replace(tmp, meta)
    return npz
