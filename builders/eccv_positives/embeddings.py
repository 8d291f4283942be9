"""The gallery of a MITL round and its embeddings by each machine annotator, computed once.

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
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from builders.infra.errors import UserFacingError

log = logging.getLogger(__name__)

OPEN_CLIP_PREFIXES = ("open_clip:", "hf-hub:", "local-dir:")


@dataclass(frozen=True)
class Gallery:
    """Images and captions of the retrieval gallery (COCO ids; paths relative to `root`)."""

    root: Path
    image_ids: list[int]
    image_files: list[str]
    caption_ids: list[int]
    caption_image_ids: list[int]
    captions: list[str]

    @classmethod
    def from_coco(cls, root: str | Path, splits: Sequence[str]) -> Gallery:
        from loading_scripts.coco import CocoSourceConfig, read_coco

        root = Path(root)
        records = read_coco(CocoSourceConfig(root, karpathy_splits=tuple(splits), with_instances=False))
        if not records:
            raise UserFacingError(f"{root}: no image of the Karpathy split(s) {list(splits)} "
                                  "(check --splits and dataset_coco.json)")
        caps = [(c.caption_id, r.image_id, c.text) for r in records for c in r.captions]
        return cls(root=root, image_ids=[r.image_id for r in records],
                   image_files=[r.path.relative_to(root).as_posix() for r in records],
                   caption_ids=[c[0] for c in caps], caption_image_ids=[c[1] for c in caps],
                   captions=[c[2] for c in caps])

    @cached_property
    def caption_image(self) -> dict[int, int]:
        """Caption id -> the image it was written for (the original COCO pairs)."""
        return dict(zip(self.caption_ids, self.caption_image_ids))

    def digest(self) -> str:
        blob = json.dumps([self.image_ids, self.image_files, self.caption_ids, self.captions])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return {"root": str(self.root), "images": [{"image_id": i, "file": f} for i, f in
                                                   zip(self.image_ids, self.image_files)],
                "captions": [{"caption_id": c, "image_id": i, "text": t} for c, i, t in
                             zip(self.caption_ids, self.caption_image_ids, self.captions)]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Gallery:
        return cls(root=Path(data["root"]), image_ids=[x["image_id"] for x in data["images"]],
                   image_files=[x["file"] for x in data["images"]],
                   caption_ids=[x["caption_id"] for x in data["captions"]],
                   caption_image_ids=[x["image_id"] for x in data["captions"]],
                   captions=[x["text"] for x in data["captions"]])


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
    from loading_scripts.images import open_rgb_image

    encoder = load_encoder(model_id)
    log.info("embedding %d images and %d captions with %s", len(gallery.image_ids),
             len(gallery.captions), model_id)
    images = np.concatenate([
        encoder.images([open_rgb_image(gallery.root / f) for f in gallery.image_files[i:i + batch_size]]).numpy()
        for i in range(0, len(gallery.image_files), batch_size)])
    captions = np.concatenate([encoder.texts(gallery.captions[i:i + batch_size]).numpy()
                               for i in range(0, len(gallery.captions), batch_size)])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, images=images.astype(np.float32), captions=captions.astype(np.float32),
             model_id=np.array(model_id))
    tmp.replace(path)  # a killed run never leaves a truncated cache entry
    return images.astype(np.float32), captions.astype(np.float32)
