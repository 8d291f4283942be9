"""Checking that a removed object is really gone (builders/decorrelation/METHOD.md §2).

Diffusion inpainting can redraw the object it was asked to remove. With `--verify-removal`, each
removal is scored with CLIP zero-shot before and after the fill: the same view of the source x and
of the synthetic x' (by default a square crop around the filled region with some context, or the
whole image) is classified against "a photo of a {class}." for every class of the build, and

    p(c | view) = softmax over the build's classes of logit_scale * cos(image, text(c)).

A removal is kept only if p(c | view of x') < `threshold` for every removed class c; otherwise it
becomes a counted skip `object_still_visible`. The softmax runs over all classes (not just the
removed ones) so the score means "CLIP would name c here", and a crop where nothing is left points
at its surroundings instead. Both scores are stored per row (`visibility_before`,
`visibility_after`, in `removed_classes` order).

The scorer is loaded once per process on first use; tests substitute `load_scorer`.

Example:
    >>> VerifyConfig(enabled=True, model="openai/clip-vit-large-patch14").threshold
    0.3
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np
from PIL import Image

from builders.decorrelation.config import VerifyConfig
from builders.engine.batching import ShrinkingBatches

if TYPE_CHECKING:
    from builders.engine.precision import Precision
    from builders.models.clip import ClipScorer

REASON_STILL_VISIBLE = "object_still_visible"
#: Padding colour of views made square: CLIP's mean pixel, so padding reads as "nothing".
_PAD = (122, 116, 104)


@dataclass(frozen=True)
class Verdict:
    #: p(c | view) per removed class, in the order given to `check`.
    before: tuple[float, ...]
    after: tuple[float, ...]
    #: Removed classes whose `after` score reaches the threshold.
    still_visible: tuple[str, ...]


class ZeroShotScorer(Protocol):
    def probabilities(self, images: Sequence[Image.Image]) -> np.ndarray:
        """[len(images) x n_classes] class probabilities, classes in the order the scorer was made with."""


class ClipZeroShot:
    """CLIP zero-shot over fixed class prompts; text embeddings are computed once."""

    def __init__(self, clip: ClipScorer, class_names: Sequence[str], prompt: str) -> None:
        self._clip = clip
        self._texts = clip.texts([prompt.format(c) for c in class_names])
        self._scale = float(clip.model.logit_scale.detach().exp())

    def probabilities(self, images: Sequence[Image.Image]) -> np.ndarray:
        logits = self._scale * self._clip.images(np.stack([np.asarray(i) for i in images])) @ self._texts.T
        return logits.softmax(dim=-1).cpu().numpy()


def load_scorer(
    config: VerifyConfig, class_names: Sequence[str], precision: Precision | None = None
) -> ZeroShotScorer:
    """The process's scorer (called once per process by `RemovalVerifier`), on the device and in
    the dtype of `precision` (default: this process's device, auto dtype)."""
    from builders.engine.precision import worker_precision
    from builders.models import clip
    from builders.models.clip_ids import TRANSFORMERS

    precision = precision or worker_precision()
    scorer = clip.load_scorer(config.model, precision.device, TRANSFORMERS, precision.dtype)
    return ClipZeroShot(scorer, class_names, config.prompt)


def view_box(mask: np.ndarray, context: float) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of a square around the mask's bounding box, grown by `context`
    times its longer side on each side, shifted (then clipped) to stay inside the image."""
    rows, cols = np.nonzero(mask)
    height, width = mask.shape
    if rows.size == 0:
        return 0, 0, width, height
    top, bottom, left, right = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
    side = int(np.ceil(max(bottom - top, right - left) * (1 + 2 * context)))
    cy, cx = (top + bottom) / 2, (left + right) / 2

    def span(centre: float, limit: int) -> tuple[int, int]:
        start = math.floor(centre - side / 2)
        start = max(0, min(start, limit - side))
        return start, min(limit, start + side)

    (x0, x1), (y0, y1) = span(cx, width), span(cy, height)
    return x0, y0, x1, y1


def square(image: Image.Image) -> Image.Image:
    """`image` centred on a square canvas, so CLIP's centre crop keeps all of it."""
    side = max(image.size)
    if image.width == image.height:
        return image
    canvas = Image.new("RGB", (side, side), _PAD)
    canvas.paste(image, ((side - image.width) // 2, (side - image.height) // 2))
    return canvas


class RemovalVerifier:
    """`check(x, x', mask, removed)` per removal; the scorer is loaded on first use."""

    def __init__(self, config: VerifyConfig, class_names: Sequence[str], precision: Precision | None = None) -> None:
        self.config, self.precision = config, precision
        self.class_names = tuple(class_names)
        self._scorer: ZeroShotScorer | None = None
        self._batches = ShrinkingBatches(
            "decorrelation removal check (CLIP)", 1, hint="try --dtype fp16 or a GPU with more memory"
        )

    def views(self, original: Image.Image, synthetic: Image.Image, mask: np.ndarray) -> list[Image.Image]:
        box = view_box(mask, self.config.context) if self.config.view == "region" else None
        return [square(im.crop(box) if box else im) for im in (original, synthetic)]

    def check(
        self, original: Image.Image, synthetic: Image.Image, mask: np.ndarray, removed: Sequence[str]
    ) -> Verdict:
        if self._scorer is None:
            self._scorer = load_scorer(self.config, self.class_names, self.precision)
        # Always the same batch (before, after): scores do not depend on other rows.
        probs = self._batches.call(self._scorer.probabilities, self.views(original, synthetic, mask))
        columns = [self.class_names.index(c) for c in removed]
        before = tuple(float(probs[0, k]) for k in columns)
        after = tuple(float(probs[1, k]) for k in columns)
        visible = tuple(c for c, p in zip(removed, after, strict=True) if p >= self.config.threshold)
        return Verdict(before, after, visible)
