"""Embedding cache of `counterfactory benchmark`: one entry per (weights digest, dataset content,
metric code version and settings), so adding a model to a report encodes only that model.

An entry is the embeddings `evaluate_model` saved (`.npz`) and its metrics (`.json`, written last,
so an interrupted write is a miss, never a half entry). The JSON holds the full key, compared on
read: a short file name can never hand one model's numbers to another. An entry is read as
untrusted input (`read_entry`): one that is not what a run writes is logged and computed again."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import numpy as np

from builders.engine.array_cache import BadEntry, entry_paths, read_arrays, read_record
from builders.engine.array_cache import write_entry as write_arrays
from builders.engine.provenance import code_version, model_name, source_digest
from builders.engine.sharding.build_files import file_sha256
from training.backends import CLIP_LOGITS, COSINE
from training.evaluation import itm_inputs
from training.ranked_scores import ranked_shapes
from training.report.results import EVALUATION_MODULES

log = logging.getLogger(__name__)


def cache_key(digest: str, preprocessing: str, ds, g_kind: str = COSINE, retrieval: dict | None = None) -> dict:
    """What the cached numbers depend on: the weights and the preprocessing that feeds them (two
    folders with the same weights may resize or tokenize differently), every table read (a local
    build named by its contents, a Hub one by the commit its revision resolved to), the metric
    code (the code version: git commit and dirty flag, or version and installed-files digest; and
    each evaluation module's own file digest, which a fix in a dirty tree changes too), the ITM
    score G read (`g_kind`), a cross-encoder's retrieval (`retrieval`: its method, k and first
    stage with that model's digests, training/rerank.py) and the evaluation settings that change a
    number (batch size and workers do not)."""
    tables = [
        [model_name(t.path) if t.commit is None else t.path, t.commit, t.config, t.split, t.rows] for t in ds.tables
    ]
    instances = ds.cfg.coco_instances
    ranked = {"retrieval": retrieval} if retrieval else {}
    return {
        **ranked,
        "weights_digest": digest,
        "preprocessing_digest": preprocessing,
        "g_kind": g_kind,
        "dataset": ds.name,
        "tables": tables,
        "k_values": list(ds.cfg.k_values),
        "eccv": bool(ds.cfg.eccv),
        "pm_instances": _instances_digest(instances) if instances else None,
        "code_version": code_version(),
        "metric_versions": {m: source_digest(m) for m in EVALUATION_MODULES},
    }


def necessity_key(digest: str, preprocessing: str, coco, dec, s_kind: str) -> dict:
    """The key of a cross-encoder's PN scores (training/report/necessity.py): `cache_key` of the
    decorrelation build, with the --coco build's tables too (x is one of its images) and PN's s
    (`s_kind`) in place of G."""
    key = cache_key(digest, preprocessing, dec)
    del key["g_kind"]
    tables = cache_key(digest, preprocessing, coco)["tables"] + key["tables"]
    return {**key, "dataset": "necessity", "s_kind": s_kind, "tables": tables}


@functools.cache
def _instances_digest(path: str) -> str:
    # COCO's instances file is ~450 MB: hashed once per report, not per model x dataset.
    return file_sha256(Path(path))


def entry_label(key: dict) -> str:
    """An entry's file name before its key digest: dataset and weights digest, so a folder
    listing tells which model each file belongs to."""
    # A renderings dataset's generator (`counterfactuals/sd15`) is no sub-folder of the cache.
    dataset = key["dataset"].replace("/", "-")
    return f"{dataset}-{key['weights_digest'].removeprefix('sha256:')[:16]}"


def read_entry(
    folder: Path, key: dict, data, width: int, shapes: dict | None = None
) -> tuple[Path, dict[str, float], dict[str, np.ndarray]] | None:
    """(embeddings file, metrics, embeddings) of `key` on `data` (the dataset's EvalData) for a
    model whose embeddings are `width` wide (`shapes`: the arrays' names and shapes, when they
    are not `expected_shapes`'), or None when not cached. The cache folder is the
    user's, but what is in it is not trusted: an entry that is not what `write_entry` writes (a
    JSON list, no metrics, a string value, object arrays, other shapes than `data` gives, a
    truncated file, a link) is a warning naming the file and a miss, never fatal, never
    unpickled."""
    npz, meta = entry_paths(folder, key, entry_label(key))
    if not os.path.lexists(meta):
        return None  # not cached, or a write interrupted before its metrics (written last)
    try:
        metrics = _read_metrics(meta, key)
        want = shapes or expected_shapes(data, width, key["g_kind"], _ranked(key))
        return npz, metrics, read_embeddings(npz, data, want)
    except BadEntry as err:
        log.warning("embedding cache entry %s; computing it again", err)
        return None


def _ranked(key: dict) -> tuple[int, int] | None:
    """(k, first-stage width) of a cross-encoder's two-stage retrieval (its key's `retrieval`)."""
    found = key.get("retrieval")
    return (found["k"], found["width"]) if found else None


def _read_metrics(meta: Path, key: dict) -> dict[str, float]:
    metrics = read_record(meta, key).get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        raise BadEntry(meta, "no metrics")
    for name, value in metrics.items():
        # NaN (an empty ITM group) is a float, as evaluate_model returns it.
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadEntry(meta, f"metric {name!r} is not a number")
    return {name: float(value) for name, value in metrics.items()}


def expected_shapes(
    data, width: int, g_kind: str = COSINE, ranked: tuple[int, int] | None = None
) -> dict[str, tuple[int, ...]]:
    """Array name -> shape of the embeddings `evaluate_model` saves for `data` (`width` wide), and
    of the ITM scores `itm_inputs` derives from them; `width` 0: a cross-encoder's, its three G
    of each counterfactual pair (`cf_g`) and no embedding. A CLIP scored by `logits_per_text`
    (`g_kind`) keeps its logit scale too (`logit_scale`, one number). A cross-encoder that
    ranks (`ranked`: its k and first-stage width) keeps its two-stage arrays too
    (training/ranked_scores.py `ranked_shapes`), and every cross-encoder its real pairs' G."""
    if width == 0:
        pairs = {"cf_g": np.zeros((len(data.cf_pairs) // 2, 3), np.float32)} if data.cf_pairs is not None else {}
        if data.retrieval is not None and len(data.retrieval) > 1:  # the real pairs' G (training/rerank.py)
            pairs["real_g"] = np.zeros((len(data.retrieval), 3), np.float32)
        if ranked is not None:
            pairs.update({name: np.zeros(shape, np.float32) for name, shape in ranked_shapes(data, *ranked).items()})
        scores = itm_inputs(pairs, data)
        return {
            **{name: v.shape for name, v in pairs.items()},
            **{f"itm_{name}": tuple(v.shape) for name, v in scores.items()},
        }
    rows = {}
    if data.retrieval is not None:
        rows.update(image=len(data.retrieval), text=len(data.captions))
    if data.queries is not None:
        rows.update(query_image=len(data.queries), gallery_text=len(data.gallery_captions))
    if data.cf_pairs is not None:
        rows.update(cf_image=len(data.cf_pairs), cf_text=len(data.cf_pairs))
    # The ITM score names and lengths as the evaluation computes them, from one-wide stand-ins.
    scale = {"logit_scale": np.ones(1, np.float32)} if g_kind == CLIP_LOGITS else {}
    scores = itm_inputs({**{name: np.zeros((n, 1), np.float32) for name, n in rows.items()}, **scale}, data)
    return {
        **{name: (n, width) for name, n in rows.items()},
        **{name: v.shape for name, v in scale.items()},
        **{f"itm_{name}": tuple(v.shape) for name, v in scores.items()},
    }


def read_embeddings(npz: Path, data, want: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The arrays of `npz`, checked against `want` (`expected_shapes`: what `evaluate_model`
    saves for `data`): the same names, float arrays of those shapes (a two-stage ranking's
    candidate columns, `..._idx`, integer); BadEntry otherwise."""
    arrays = read_arrays(npz, want)
    images = 0 if data.image_ids is None else len(data.image_ids)
    galleries = {"rr_i2t_idx": len(data.captions), "rr_t2i_idx": images, "rr_q2t_idx": len(data.gallery_captions)}
    for name, size in galleries.items():
        found = arrays.get(name)
        if found is not None and found.size and (found.min() < 0 or found.max() >= size):
            raise BadEntry(npz, f"array {name!r} names a candidate outside the {size} of its gallery")
    return arrays


def write_entry(folder: Path, key: dict, npz_written: Path, metrics: dict[str, float]) -> Path:
    """Move the embeddings `evaluate_model` wrote to `npz_written` (a `new_file`) into the cache
    beside their metrics; the cached `.npz` path. A bad entry of the same key is replaced."""
    return write_arrays(folder, key, entry_label(key), npz_written, {"metrics": metrics})
