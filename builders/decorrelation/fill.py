"""Filling the removed region of an image (builders/decorrelation/METHOD.md §2): diffusion inpainting and three baselines.

- `inpaint` (default): a diffusers inpainting pipeline (any `StableDiffusionInpaintPipeline`
  model id or local folder) with a neutral prompt ("background"). The paper used a GAN inpainter
  that the ecosystem does not offer; diffusion inpainting is the modern equivalent. The image and
  mask are resized to a square `image_size` working resolution (a multiple of 8, as the VAE
  needs), the result is resized back, and only the masked pixels are replaced: pixels outside the
  removed region stay byte-identical to the source.
- `zero`: removed pixels set to 0 (black).
- `mean`: removed pixels set to the per-channel mean of the removed region (rounded).
- `blur`: removed pixels replaced by a Gaussian blur (radius `blur_radius` px) of the image.

The filled mask is the selection's removed region (every pixel the removed boxes touch) grown by
`mask_dilation` pixels on every side (`dilate`), as inpainting practice grows masks: box edges,
JPEG colour bleed and anti-aliased outlines sit on or just outside a tight box
(builders/decorrelation/METHOD.md §2). The selection rules themselves use the undilated region.

Every fill is a function of (image, mask, seed): inpainting draws its noise from a CPU
`torch.Generator` seeded per row, and runs one image at a time so results do not depend on
batch composition. On the CPU the output was checked to be identical for 1 and 2 torch threads;
on GPUs, byte-identical reruns also need deterministic kernels (same hardware and versions).

Example:
    >>> from PIL import Image
    >>> import numpy as np
    >>> mask = np.zeros((4, 4), bool); mask[1:3, 1:3] = True
    >>> out = ImageFiller(FillConfig(method="zero")).fill(Image.new("RGB", (4, 4), "white"), mask, 0)
    >>> np.asarray(out)[1, 1].tolist(), np.asarray(out)[0, 0].tolist()
    ([0, 0, 0], [255, 255, 255])
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image, ImageFilter

from builders.decorrelation.config import FillConfig
from builders.engine.batching import ShrinkingBatches
from builders.engine.precision import Precision, worker_precision


def dilate(mask: np.ndarray, pixels: int) -> np.ndarray:
    """Bool `mask` grown by `pixels` in every direction (a square of side 2 * pixels + 1 around
    each masked pixel), clipped to the image. For a union of boxes this is the union of the boxes
    grown by `pixels` on each side."""
    out = mask.astype(bool, copy=True)
    # A square window is separable: grow along columns, then along rows, one shifted OR per pixel.
    for axis in (1, 0):
        grown = out.copy()
        for d in range(1, min(pixels, out.shape[axis] - 1) + 1):
            head, tail = [slice(None)] * 2, [slice(None)] * 2
            head[axis], tail[axis] = slice(d, None), slice(None, -d)
            grown[tuple(head)] |= out[tuple(tail)]
            grown[tuple(tail)] |= out[tuple(head)]
        out = grown
    return out


def composite(original: Image.Image, filled: np.ndarray, mask: np.ndarray) -> Image.Image:
    """`original` with the masked pixels taken from `filled` (uint8 [H x W x 3])."""
    out = np.asarray(original, dtype=np.uint8).copy()
    out[mask] = filled[mask]
    return Image.fromarray(out, mode="RGB")


class ImageFiller:
    """Fills masks per `FillConfig`; the inpainting pipeline is loaded on first use, on the
    device and in the dtype of `precision` (the builder's; default: this process's device, auto
    dtype)."""

    def __init__(self, config: FillConfig, precision: Precision | None = None) -> None:
        self.config, self.precision = config, precision
        self._pipe: Any = None
        # One image per call (see above): out of memory is one clear error, not a traceback.
        self._batches = ShrinkingBatches(
            "decorrelation fill (inpainting)",
            1,
            hint="try a smaller --image-size, --dtype fp16 or a GPU with more memory",
        )

    def fill(self, image: Image.Image, mask: np.ndarray, seed: int) -> Image.Image:
        """The synthetic image x': `image` (RGB) with the bool `mask` [H x W] filled."""
        if image.mode != "RGB":
            raise ValueError(f"expected an RGB image, got mode {image.mode}")
        if mask.shape != (image.height, image.width):
            raise ValueError(f"mask shape {mask.shape} does not match the image {image.height}x{image.width}")
        pixels = np.asarray(image, dtype=np.uint8)
        method = self.config.method
        if method == "zero":
            filled = np.zeros_like(pixels)
        elif method == "mean":
            mean = np.rint(pixels[mask].astype(np.float64).mean(axis=0)) if mask.any() else np.zeros(3)
            filled = np.broadcast_to(mean.astype(np.uint8), pixels.shape)
        elif method == "blur":
            filled = np.asarray(image.filter(ImageFilter.GaussianBlur(self.config.blur_radius)))
        else:
            filled = self._batches.call(self._inpaint, image, mask, seed)
        return composite(image, filled, mask)

    def _inpaint(self, image: Image.Image, mask: np.ndarray, seed: int) -> np.ndarray:
        import torch

        from builders.models.loaders import load_sd

        cfg = self.config
        if self._pipe is None:
            precision = self.precision or worker_precision()
            self._pipe = load_sd(cfg.model, inpaint=True, device=precision.device, dtype=precision.dtype)
        size = (cfg.image_size, cfg.image_size)
        # A pixel of the working mask is masked if any source pixel under it is, so small
        # objects never vanish from the mask when downscaling.
        work_mask = Image.fromarray(mask.astype(np.uint8) * 255, mode="L").resize(size, Image.BOX)
        work_mask = work_mask.point(lambda v: 255 if v > 0 else 0)
        with torch.inference_mode():
            out = self._pipe(
                prompt=cfg.prompt,
                image=image.resize(size, Image.BICUBIC),
                mask_image=work_mask,
                height=cfg.image_size,
                width=cfg.image_size,
                num_inference_steps=cfg.steps,
                guidance_scale=cfg.guidance_scale,
                output_type="np",
                generator=torch.Generator("cpu").manual_seed(seed),
            ).images[0]
        inpainted = Image.fromarray(np.rint(np.clip(out, 0, 1) * 255).astype(np.uint8), mode="RGB")
        return np.asarray(inpainted.resize(image.size, Image.BICUBIC))
