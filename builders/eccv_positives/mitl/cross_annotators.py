"""A cross-encoder as a machine annotator (METHOD.md §2): BLIP, FLAVA, ViLT or BridgeTower's ITM
head, each ranking as its own paper does (builders/models/cross_ranking.py, the copy
`counterfactory benchmark` ranks with).

ECCV Caption's annotators include ViLT (Chun et al. 2022, Table 1), a cross-encoder: it scores
one (image, caption) pair per forward call and has no embedding to retrieve by, so a full ranking
costs |images| x |captions| calls (the paper notes the cost, §4.1).

- FLAVA ranks by its contrastive embeddings alone: an embedding annotator (embeddings.py embeds
  the gallery with its contrastive heads and caches them like a CLIP's).
- BLIP's ITC embeddings (cached the same way) pick each query's top `rerank_k`, ranked by ITM
  logit + ITC similarity.
- ViLT and BridgeTower's ITM head re-rank the top `rerank_k` of a first-stage annotator the user
  names (`--first-stage`: a CLIP, or a model with contrastive embeddings, by the benchmark's rule,
  `cross_ranking.check_first_stage`) by their own G (builders/models/cross_encoders.py:
  `logits[:, 0]` for ViLT, the "match" logit for BridgeTower).

A re-ranker's top-k are its proposals and its top-`exclusion_depth` its exclusion list. With
`rerank_k` the gallery size this is the cross-encoder's full ranking. Ties go to the lower
gallery index, as for the embedding annotators; each distinct (image, caption text) pair is
scored once. The re-ranked scores are cached (builders/engine/array_cache.py, the store of the
benchmark's cache) under the weights of the model and of its first stage, the gallery, the
queries, the method, k, G and the precision: a second round with the same inputs scores no pair.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np

from builders.eccv_positives.mitl.image_gallery import Gallery
from builders.engine.array_cache import BadEntry, entry_paths, read_arrays, read_record, store_arrays
from builders.models.clip_ids import weights_fingerprint
from builders.models.cross_encoders import ADAPTERS, FIRST_STAGE_METHOD, score_pairs
from builders.models.cross_ranking import CONTRASTIVE_METHOD, method_of, reranked_scores

log = logging.getLogger(__name__)

#: The cache's sub-folder of the MITL cache folder.
SCORES_FOLDER = "cross_encoder_scores"


def needs_first_stage(architecture: str) -> bool:
    return method_of(architecture) == FIRST_STAGE_METHOD


def _pair_plans(first_top: dict, gallery: Gallery, queries: dict) -> tuple[dict, dict]:
    """The distinct (image row, caption text) pairs of the candidates (pair -> index), and per
    modality each candidate's (image row, caption row)."""
    image_row, caption_row = gallery.image_row, gallery.caption_row
    pairs: dict[tuple[int, str], int] = {}
    rows = {}
    for modality in ("i2t", "t2i"):
        top = np.asarray(first_top[modality], dtype=np.int64)
        if modality == "i2t":
            ic = [
                [(image_row[q], caption_row[int(c)]) for c in row] for q, row in zip(queries["i2t"], top, strict=True)
            ]
        else:
            ic = [
                [(image_row[int(i)], caption_row[q]) for i in row] for q, row in zip(queries["t2i"], top, strict=True)
            ]
        rows[modality] = np.asarray(ic, dtype=np.int64).reshape(*top.shape, 2)
        for i, c in (p for row in ic for p in row):
            pairs.setdefault((i, gallery.captions[c]), len(pairs))
    return pairs, rows


def _score(model: str, architecture: str, first: tuple, gallery: Gallery, queries: dict, run: tuple) -> dict:
    """Per modality, the re-ranked score of each candidate of `first` (embeddings, top ids):
    G of every distinct pair, in batches with progress, plus BLIP's ITC similarity."""
    from builders.models.clip_ids import parse_clip_id
    from builders.models.cross_encoders import load_cross_encoder

    precision, batch = run
    (image_emb, caption_emb), first_top = first
    pairs, rows = _pair_plans(first_top, gallery, queries)
    backend = load_cross_encoder(parse_clip_id(model), architecture, precision.device, precision.dtype)
    desc = f"MITL re-rank pairs of {backend.model_id}"
    g = score_pairs(backend, list(pairs), lambda keys: [gallery.open_image(r) for r in keys], batch, desc)
    out = {}
    for modality, ic in rows.items():
        i, c = ic[..., 0], ic[..., 1]
        keys = np.fromiter(
            (pairs[(a, gallery.captions[b])] for a, b in zip(i.ravel(), c.ravel(), strict=True)), np.int64
        )
        itc = np.einsum("nd,nd->n", np.asarray(image_emb[i.ravel()]), np.asarray(caption_emb[c.ravel()]))
        score = reranked_scores(method_of(architecture), g[keys], itc.astype(np.float32))
        out[modality] = score.reshape(i.shape).astype(np.float32)
    return out


def _cache_key(model: str, architecture: str, k: int, first_stage: str | None, round_: tuple) -> dict:
    """What the re-ranked scores depend on, named as the benchmark's cache key names it
    (training/report/cache.py): the weights (each annotator's files, as embeddings.py keys
    them), the gallery, the queries, the method, k, the first stage and G."""
    gallery, queries, dtype = round_
    source = first_stage or model
    return {
        "weights_digest": weights_fingerprint(model),
        "g_kind": ADAPTERS[architecture].g_kind,
        "dataset": [gallery.digest(), gallery.files_fingerprint()],
        "queries": hashlib.sha256(json.dumps(queries, sort_keys=True).encode()).hexdigest(),
        "retrieval": {"method": method_of(architecture), "k": k, "first_stage": first_stage},
        "first_stage_digest": weights_fingerprint(source),
        "dtype": dtype,
    }


def _cached(folder: Path, key: dict, first_top: dict) -> dict | None:
    """The cached scores of `key`, or None; an entry that is not what `reranked_topk` writes, or
    whose candidates are not `first_top`, is logged and scored again."""
    npz, meta = entry_paths(folder, key, "mitl")
    if not os.path.lexists(meta):
        return None  # not cached, or a write interrupted before its record (written last)
    try:
        read_record(meta, key)
        want = {f"rr_{m}_{part}": np.shape(first_top[m]) for m in first_top for part in ("idx", "score")}
        arrays = read_arrays(npz, want)
        if any(not np.array_equal(arrays[f"rr_{m}_idx"], first_top[m]) for m in first_top):
            raise BadEntry(npz, "other candidates than the first stage's")
    except BadEntry as err:
        log.warning("MITL score cache entry %s; scoring it again", err)
        return None
    return {m: arrays[f"rr_{m}_score"] for m in first_top}


def reranked_topk(
    model: str, architecture: str, first: tuple, round_: tuple, depth: int, run: tuple
) -> dict[str, np.ndarray]:
    """Per modality, [n_queries x depth] gallery ids of `model`'s ranking of the first stage's
    candidates; `first`: (the first stage's (image, caption) embeddings, its top gallery ids per
    modality, [n_queries x rerank_k]); `round_`: gallery, queries, cache folder; `run`: precision,
    batch size, rerank_k, the --first-stage spec (None: the model's own ITC)."""
    gallery, queries, cache = round_
    precision, batch, k, first_stage = run
    first_top = {m: np.asarray(t, dtype=np.int64) for m, t in first[1].items()}
    folder = Path(cache) / SCORES_FOLDER
    keyed = (model, architecture, k, first_stage, (gallery, queries, precision.dtype))
    scores = _cached(folder, _cache_key(*keyed), first_top)
    if scores is None:
        scores = _score(model, architecture, first, gallery, queries, (precision, batch))
        # Loading a Hub model may have just downloaded it: keyed by the snapshot now cached.
        _store(folder, _cache_key(*keyed), first_top, scores)
    else:
        log.info("re-ranked scores of %s: cached in %s", model, folder)
    out = {}
    for modality, top in first_top.items():
        index = gallery.caption_row if modality == "i2t" else gallery.image_row
        ranked = np.empty((len(top), min(depth, top.shape[1])), dtype=np.int64)
        for r, (items, score) in enumerate(zip(top, scores[modality], strict=True)):
            position = np.array([index[int(i)] for i in items])
            ranked[r] = items[np.lexsort((position, -score))][: ranked.shape[1]]
        out[modality] = ranked
    return out


def _store(folder: Path, key: dict, first_top: dict, scores: dict) -> None:
    arrays = {**{f"rr_{m}_idx": first_top[m] for m in first_top}, **{f"rr_{m}_score": scores[m] for m in first_top}}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        store_arrays(folder, key, "mitl", arrays, {})
    except OSError as err:  # the proposals still count
        log.warning("MITL score cache %s: cannot store (%s); not cached", folder, err)


def record(architecture: str, rerank_k: int, first_stage: str | None) -> dict:
    """What the round's provenance says of a cross-encoder annotator, as the benchmark's records
    say it (`method`, `k`, `first_stage`) with the G that ranks: FLAVA ranks by its contrastive
    cosine, no G and k 0; BLIP by its own ITC first (no first stage)."""
    method = method_of(architecture)
    return {
        "architecture": architecture,
        "method": method,
        "k": 0 if method == CONTRASTIVE_METHOD else rerank_k,
        "first_stage": first_stage if method == FIRST_STAGE_METHOD else None,
        "g": None if method == CONTRASTIVE_METHOD else ADAPTERS[architecture].g_kind,
    }
