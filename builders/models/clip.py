"""CLIP embeddings for every stage that scores images against text (transformers CLIP).

The counterfactual image filter, the decorrelation removal check and the ECCV positives tools all
embed through `ClipScorer`, so they agree on normalisation, dtype and the device (the model's).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch


class ClipScorer:
    """Normalised CLIP text and image embeddings (transformers CLIP)."""

    def __init__(self, model: Any, processor: Any) -> None:
        self.model, self.processor = model, processor

    @torch.inference_mode()
    def texts(self, texts: Sequence[str]) -> torch.Tensor:
        enc = self.processor(text=list(texts), return_tensors="pt", padding=True, truncation=True)
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        return torch.nn.functional.normalize(self._tensor(self.model.get_text_features(**enc)), dim=-1)

    @torch.inference_mode()
    def images(self, images: np.ndarray) -> torch.Tensor:
        enc = self.processor(images=list(images), return_tensors="pt")
        pixels = enc["pixel_values"].to(self.model.device)
        features = self.model.get_image_features(pixel_values=pixels)
        return torch.nn.functional.normalize(self._tensor(features), dim=-1)

    @staticmethod
    def _tensor(out: Any) -> torch.Tensor:
        # transformers 5 may return a model output object instead of the bare projection.
        return (out if isinstance(out, torch.Tensor) else out.pooler_output).float()
