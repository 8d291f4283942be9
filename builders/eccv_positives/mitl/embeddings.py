"""The embeddings of a MITL gallery by each machine annotator, computed once.

A machine annotator is any CLIP-like model: a transformers CLIP id or folder, or an open_clip
model (`open_clip:ARCH[:TAG]`, `hf-hub:ORG/REPO`, `local-dir:PATH`; `builders.models.clip_ids`),
or the contrastive heads of a BLIP or FLAVA (cross_annotators.py), embedding through
`builders.models.clip.load_scorer` (`builders.models.cross_ranking.ItcScorer`) on the process's
device (its GPU when there is one, `builders.engine.distributed.worker_device`; the vectors come
back to the CPU in float32) in the precision of `--dtype` (`builders.engine.precision`: fp16 on a GPU by default). Each
embeds every gallery image and every distinct caption text once (a repeated caption reuses its
vector, so identical captions tie exactly in retrieval, METHOD.md §2). The normalised embeddings
are cached in `cache_dir`, one folder per entry holding `images.npy` and `captions.npy`, read
back memory-mapped (a 600K-caption gallery is not loaded into memory to be streamed over). The
key covers the model id, a fingerprint of its weight files, the gallery's ids and texts and the
size and mtime of its image files, and the dtype when it is not fp32: later runs (more queries,
another seed, the model-bias analysis) reuse an entry, retrained weights, replaced images or
another precision do not.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from builders.eccv_positives.mitl.image_gallery import Gallery
from builders.engine.batching import ShrinkingBatches
from builders.engine.precision import Precision, worker_precision
from builders.models.clip_ids import weights_fingerprint

log = logging.getLogger(__name__)


def _cache_key(model_id: str, gallery_key: list[str], dtype: str) -> str:
    # fp32 entries keep the key they had before the dtype existed: caches stay valid.
    precision = [] if dtype == "fp32" else [dtype]
    blob = json.dumps([model_id, weights_fingerprint(model_id), *gallery_key, *precision])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def write_cache_entry(entry: Path, images: np.ndarray, captions: np.ndarray, meta: dict[str, Any]) -> None:
    """Write an entry folder atomically: built under a temporary name, then renamed, so a
    killed run never leaves a half-written entry and concurrent runs keep the first one."""
    entry = Path(entry)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_name(f".{entry.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    np.save(tmp / "images.npy", np.ascontiguousarray(images, dtype=np.float32))
    np.save(tmp / "captions.npy", np.ascontiguousarray(captions, dtype=np.float32))
    (tmp / "meta.json").write_text(json.dumps(meta))
    try:
        tmp.rename(entry)
    except OSError:
        if not (entry / "meta.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another run stored the same entry first


def read_cache_entry(entry: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """(images, captions) memory-mapped read-only, or None when the entry is absent."""
    entry = Path(entry)
    if not (entry / "meta.json").is_file():
        return None
    return (np.load(entry / "images.npy", mmap_mode="r"), np.load(entry / "captions.npy", mmap_mode="r"))


def gallery_embeddings(
    model_id: str,
    gallery: Gallery,
    cache_dir: Path,
    batch_size: int = 64,
    precision: Precision | None = None,
    architecture: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(image embeddings [I x d], caption embeddings [C x d]), L2-normalised float32, cached;
    computed on `precision`'s device and dtype (default: this process's, auto dtype) by a CLIP,
    or by the contrastive heads of a BLIP or FLAVA (`architecture`, builders/models/cross_ranking.py)."""
    precision = precision or worker_precision()
    gallery_key = [gallery.digest(), gallery.files_fingerprint()]
    entry = Path(cache_dir) / _cache_key(model_id, gallery_key, precision.dtype)
    cached = read_cache_entry(entry)
    if cached is not None:
        log.info("embeddings of %s: cached in %s", model_id, entry)
        return cached
    scorer = _load_scorer(model_id, architecture, precision)
    texts = list(dict.fromkeys(gallery.captions))
    log.info(
        "embedding %d images and %d distinct captions (of %d) with %s",
        len(gallery.image_ids),
        len(texts),
        len(gallery.captions),
        model_id,
    )
    # Halved and retried on out-of-memory; an embedding does not depend on its batch mates.
    hint = "try half precision (--dtype fp16) or a GPU with more memory"
    images = np.concatenate(
        ShrinkingBatches("MITL image embeddings", batch_size, hint).map(
            range(len(gallery.image_ids)),
            lambda idx: [scorer.images([gallery.open_image(n) for n in idx]).cpu().numpy()],
        )
    ).astype(np.float32)
    distinct = np.concatenate(
        ShrinkingBatches("MITL caption embeddings", batch_size, hint).map(
            texts, lambda chunk: [scorer.texts(list(chunk)).cpu().numpy()]
        )
    ).astype(np.float32)
    row = {t: n for n, t in enumerate(texts)}
    captions = distinct[[row[t] for t in gallery.captions]]
    # Loading a Hub model may have just downloaded it: key the entry by the snapshot now cached,
    # so the next run (which finds that snapshot) hits it.
    entry = Path(cache_dir) / _cache_key(model_id, gallery_key, precision.dtype)
    write_cache_entry(entry, images, captions, {"model_id": model_id, "gallery": gallery.digest()})
    return images, captions


def _load_scorer(model_id: str, architecture: str | None, precision: Precision):
    if architecture is None:
        from builders.models.clip import load_scorer

        return load_scorer(model_id, precision.device, dtype=precision.dtype)
    from builders.models.clip_ids import parse_clip_id
    from builders.models.cross_encoders import load_cross_encoder
    from builders.models.cross_ranking import ItcScorer

    return ItcScorer(load_cross_encoder(parse_clip_id(model_id), architecture, precision.device, precision.dtype))
