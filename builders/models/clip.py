"""CLIP embeddings for every stage, the MITL tools and the trainer (transformers CLIP and open_clip).

The counterfactual image filter, the decorrelation removal check and the ECCV positives
annotators embed through a scorer (`ClipScorer` for transformers, `OpenClipScorer` for open_clip;
`load_scorer` picks one by id, `clip_ids`), so they agree on normalisation and dtype (float32).
The model is placed once, in its precision (`--dtype`), by whoever loads it; inputs follow it to
its device and dtype, and embeddings come back in float32 whatever it ran in. The trainer's
trainable towers read transformers outputs through the same `features`.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from builders.engine.errors import UserFacingError
from builders.models.clip_ids import TRANSFORMERS, ClipIdError, parse_clip_id
from builders.models.loaders import load_clip, load_open_clip


def features(out: Any) -> torch.Tensor:
    """The projection a `get_text_features` / `get_image_features` call returns: transformers 5
    may return a model output object (its `pooler_output`) instead of the bare tensor."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def normalized(out: Any) -> torch.Tensor:
    """L2-normalised float32 embeddings of a features call (a tensor or a model output)."""
    return torch.nn.functional.normalize(features(out).float(), dim=-1)


class ClipScorer:
    """Normalised CLIP text and image embeddings (transformers CLIP)."""

    def __init__(self, model: Any, processor: Any) -> None:
        self.model, self.processor = model, processor

    @torch.inference_mode()
    def texts(self, texts: Sequence[str]) -> torch.Tensor:
        enc = self.processor(text=list(texts), return_tensors="pt", padding=True, truncation=True)
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        return normalized(self.model.get_text_features(**enc))

    @torch.inference_mode()
    def images(self, images: Sequence[Any]) -> torch.Tensor:
        enc = self.processor(images=list(images), return_tensors="pt")
        pixels = enc["pixel_values"].to(self.model.device, self.model.dtype)
        return normalized(self.model.get_image_features(pixel_values=pixels))


class OpenClipScorer:
    """Normalised CLIP text and image embeddings (open_clip): `ClipScorer`'s two methods."""

    def __init__(self, model: Any, preprocess: Any, tokenizer: Any) -> None:
        self.model, self.preprocess, self.tokenizer = model, preprocess, tokenizer
        # open_clip models have no `.device` / `.dtype`: the weights' are the model's.
        weight = next(model.parameters())
        self.device, self.dtype = weight.device, weight.dtype

    @torch.inference_mode()
    def texts(self, texts: Sequence[str]) -> torch.Tensor:
        return normalized(self.model.encode_text(self.tokenizer(list(texts)).to(self.device)))

    @torch.inference_mode()
    def images(self, images: Sequence[Any]) -> torch.Tensor:
        pixels = torch.stack([self.preprocess(im) for im in images]).to(self.device, self.dtype)
        return normalized(self.model.encode_image(pixels))


def load_scorer(
    model_id: str, device: str = "cpu", backend: str | None = None, dtype: str = "fp32"
) -> ClipScorer | OpenClipScorer:
    """The scorer of `model_id` on `device` in `dtype`; `backend` None infers it from the id
    (`clip_ids`). The builders' configs hold their CLIP ids as text: this is where they are
    parsed, once."""
    try:
        clip = parse_clip_id(model_id, backend)
    except ClipIdError as err:
        raise UserFacingError(f"the CLIP model {model_id!r} {err}") from None
    if clip.backend == TRANSFORMERS:
        return ClipScorer(*load_clip(clip.name, device, dtype))
    return OpenClipScorer(*load_open_clip(clip, device, dtype))
