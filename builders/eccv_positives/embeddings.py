"""The embeddings of a MITL gallery by each machine annotator, computed once.

A machine annotator is any CLIP-like model: a transformers CLIP id or folder, or an open_clip
model (`open_clip:ARCH[:TAG]`, `hf-hub:ORG/REPO`, `local-dir:PATH`). Each embeds every gallery
image and caption once; the normalised embeddings are cached in `cache_dir` under a key made of
the model id and the gallery's content, so later runs (more queries, another seed, the model-bias
analysis) reuse them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from builders.eccv_positives.gallery import Gallery

log = logging.getLogger(__name__)

OPEN_CLIP_PREFIXES = ("open_clip:", "hf-hub:", "local-dir:")


class _OpenClipEncoder:
    """open_clip counterpart of `ClipScorer` (same two methods, normalised float32 tensors)."""

    def __init__(self, model: Any, preprocess: Any, tokenizer: Any) -> None:
        self.model, self.preprocess, self.tokenizer = model, preprocess, tokenizer

    def texts(self, texts: Sequence[str]):
        import torch

        with torch.inference_mode():
            out = self.model.encode_text(self.tokenizer(list(texts)))
        return torch.nn.functional.normalize(out.float(), dim=-1)

    def images(self, images: Sequence[Any]):
        import torch

        with torch.inference_mode():
            out = self.model.encode_image(torch.stack([self.preprocess(im) for im in images]))
        return torch.nn.functional.normalize(out.float(), dim=-1)


def load_encoder(model_id: str):
    """An object with `.images(list of PIL)` and `.texts(list of str)` -> normalised embeddings."""
    from builders.infra.models.loaders import load_clip, load_open_clip

    if model_id.startswith(OPEN_CLIP_PREFIXES):
        name = model_id.removeprefix("open_clip:")
        return _OpenClipEncoder(*load_open_clip(name))
    from builders.counterfactuals.images import ClipScorer

    return ClipScorer(*load_clip(model_id))


def gallery_embeddings(model_id: str, gallery: Gallery, cache_dir: Path,
                       batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(image embeddings [I x d], caption embeddings [C x d]), L2-normalised, cached."""
    key = hashlib.sha256(f"{model_id}|{gallery.digest()}".encode()).hexdigest()[:20]
    path = Path(cache_dir) / f"{key}.npz"
    if path.is_file():
        with np.load(path) as cached:
            log.info("embeddings of %s: cached in %s", model_id, path)
            return cached["images"], cached["captions"]
    encoder = load_encoder(model_id)
    log.info("embedding %d images and %d captions with %s", len(gallery.image_ids),
             len(gallery.captions), model_id)
    images = np.concatenate([
        encoder.images([gallery.open_image(n) for n in range(i, min(i + batch_size, len(gallery.image_ids)))]).numpy()
        for i in range(0, len(gallery.image_ids), batch_size)])
    captions = np.concatenate([encoder.texts(gallery.captions[i:i + batch_size]).numpy()
                               for i in range(0, len(gallery.captions), batch_size)])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, images=images.astype(np.float32), captions=captions.astype(np.float32),
             model_id=np.array(model_id))
    tmp.replace(path)  # a killed run never leaves a truncated cache entry
    return images.astype(np.float32), captions.astype(np.float32)
