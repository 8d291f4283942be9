"""Object necessity PN in `counterfactory benchmark`: x is a decorrelation query's source image
among the --coco build's images, x' (the query) and y (an original caption of x that mentions the
removed class) come from the decorrelation build, as the trainer's --eval-only scores them with
both (training/necessity.py: `necessity_pairs`, `necessity_values`, `necessity`).

s(x, y), a match score in [0, 1], is the model's own (`s_kind`, recorded with PN): a dual
encoder's cosine mapped to [0, 1], from its embeddings of both builds; a cross-encoder's ITM
match probability (builders/models/cross_encoders.py), scored pair by pair, each distinct pair
once (training/rerank.py `necessity_s`, the trainer's scoring too), and cached here per (weights,
preprocessing, both builds, s_kind). ViLT has none: refused in one line."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from training.necessity import cosine_s, necessity, necessity_pairs, necessity_values, original_rows
from builders.engine.array_cache import store_arrays
from training.report.cache import entry_label, necessity_key, read_entry
from training.rerank import necessity_s, say_no_necessity
from training.statistics import UnitScores
from training.unit_scores import necessity_units

log = logging.getLogger(__name__)

Found = tuple[dict[str, float], dict[str, UnitScores], list[tuple[int, str, float]]]


def object_necessity(backend, name: str, sets: tuple, scored: dict, cache: tuple[Path, tuple, int]) -> Found | None:
    """PN per removed class and its mean, its per-unit scores and its `(query, class, PN)` values
    (for its floor) of the model `name` (`backend`), on `sets` (the --coco and the decorrelation
    datasets); `scored`: a dual encoder's embeddings of both (run.PN_ARRAYS); `cache`: the cache
    folder, the model's digests and the batch size. None, said in one line with the head's own
    reason (`no_s`), for a model with no s."""
    coco, dec = sets
    if not backend.s_kind:
        say_no_necessity(name, backend)
        return None
    rows = original_rows(dec.data.query_image_ids, coco.data.image_ids)
    if (rows < 0).all():
        log.warning(
            "object necessity: no decorrelation query's source image is in the --coco "
            "split; PN needs the split the decorrelation build's images came from"
        )
    pairs = necessity_pairs(rows, dec.data)
    if backend.dual_encoder:
        s = cosine_s(scored["coco"]["image"], rows, scored["decorrelation"], pairs)
    else:
        s = _match_probabilities(backend, sets, rows, pairs, cache)
    values = necessity_values(pairs, s)
    return necessity(values), necessity_units(values, len(rows), dec.data.query_image_ids), values


def _match_probabilities(backend, sets: tuple, rows: np.ndarray, pairs: list, cache: tuple) -> np.ndarray:
    """(pairs, 2): a cross-encoder's s(x, y) and s(x', y) of each `necessity_pairs` pair, from the
    cache or scored (training/rerank.py `necessity_s`, the trainer's scoring too)."""
    (coco, dec), (folder, digests, batch) = sets, cache
    if not pairs:
        return np.zeros((0, 2), np.float32)
    key = necessity_key(*digests, coco, dec, backend.s_kind)
    hit = read_entry(folder, key, dec.data, 0, {"s": (len(pairs), 2)})
    if hit is not None:
        return hit[2]["s"]
    out = necessity_s(backend, coco.data.retrieval, dec.data, rows, pairs, batch)
    try:
        metrics = {"metrics": necessity(necessity_values(pairs, out))}
        store_arrays(folder, key, entry_label(key), {"s": out}, metrics)
    except OSError as err:  # e.g. a folder where the entry goes: the numbers still count
        log.warning(
            "embedding cache %s: cannot store the PN scores of %s (%s); not cached", folder, backend.model_id, err
        )
    return out
