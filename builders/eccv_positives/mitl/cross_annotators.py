"""A cross-encoder as a machine annotator (METHOD.md §2): ViLT or BridgeTower's ITM head.

ECCV Caption's annotators include ViLT (Chun et al. 2022, Table 1), a cross-encoder: it scores
one (image, caption) pair per forward call and has no embedding to retrieve by, so a full ranking
costs |images| x |captions| calls (the paper notes the cost, §4.1). Here, as in the report's
retrieval (training/rerank.py), a first-stage annotator the user names (`--first-stage`, a CLIP)
picks each query's top `rerank_k` by its cosine, and the cross-encoder's own G
(builders/models/cross_encoders.py: `logits[:, 0]` for ViLT, the "match" logit for BridgeTower)
ranks them; its top-k are its proposals and its top-`exclusion_depth` its exclusion list. With
`rerank_k` the gallery size this is the cross-encoder's full ranking. Ties go to the lower gallery
index, as for the embedding annotators; each distinct (image, caption text) pair is scored once.
"""

from __future__ import annotations

import logging

import numpy as np

from builders.eccv_positives.mitl.image_gallery import Gallery
from builders.engine.precision import Precision
from builders.models.cross_encoders import ADAPTERS, FIRST_STAGE_METHOD, score_pairs

log = logging.getLogger(__name__)

#: The cross-encoders' heads that annotate by re-ranking a first stage (architecture names).
RERANKING_HEADS = ("ViltForImageAndTextRetrieval", "BridgeTowerForImageAndTextRetrieval")


def reranked_topk(
    model: str,
    architecture: str,
    first_top: dict[str, np.ndarray],
    gallery: Gallery,
    queries: dict[str, list[int]],
    depth: int,
    run: tuple[Precision, int],
) -> dict[str, np.ndarray]:
    """Per modality, [n_queries x depth] gallery ids of `model`'s ranking of the first stage's
    candidates `first_top` (gallery ids, [n_queries x rerank_k]); `run`: precision, batch size."""
    from builders.models.clip_ids import parse_clip_id
    from builders.models.cross_encoders import load_cross_encoder

    precision, batch = run
    backend = load_cross_encoder(parse_clip_id(model), architecture, precision.device, precision.dtype)
    image_row = {i: n for n, i in enumerate(gallery.image_ids)}
    caption_row = {c: n for n, c in enumerate(gallery.caption_ids)}
    pairs: dict[tuple[int, str], int] = {}
    plans = {}
    for modality in ("i2t", "t2i"):
        top = np.asarray(first_top[modality], dtype=np.int64)
        if modality == "i2t":
            rows = [
                [(image_row[q], caption_row[int(c)]) for c in row] for q, row in zip(queries["i2t"], top, strict=True)
            ]
        else:
            rows = [
                [(image_row[int(i)], caption_row[q]) for i in row] for q, row in zip(queries["t2i"], top, strict=True)
            ]
        keys = [[pairs.setdefault((i, gallery.captions[c]), len(pairs)) for i, c in row] for row in rows]
        plans[modality] = (top, np.asarray(keys, dtype=np.int64).reshape(top.shape))
    desc = f"MITL re-rank pairs of {backend.model_id}"
    scores = score_pairs(backend, list(pairs), lambda rows: [gallery.open_image(r) for r in rows], batch, desc)
    out = {}
    for modality, (top, keys) in plans.items():
        index = caption_row if modality == "i2t" else image_row
        ranked = np.empty((len(top), min(depth, top.shape[1])), dtype=np.int64)
        for r, (items, k) in enumerate(zip(top, keys, strict=True)):
            position = np.array([index[int(i)] for i in items])
            ranked[r] = items[np.lexsort((position, -scores[k]))][: ranked.shape[1]]
        out[modality] = ranked
    return out


def record(architecture: str, rerank_k: int, first_stage: str) -> dict:
    """What the round's provenance says of a cross-encoder annotator."""
    return {
        "architecture": architecture,
        "method": FIRST_STAGE_METHOD,
        "k": rerank_k,
        "first_stage": first_stage,
        "g": ADAPTERS[architecture].g_kind,
    }
