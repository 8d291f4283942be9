"""Images into RGB as transformers' processors do it, shared by the CLIP backends
(training/backends.py) and the cross-encoders (builders/models/cross_encoders.py)."""

from __future__ import annotations

from PIL import Image


class TransformersRGB:
    """transformers' `image_transforms.convert_to_rgb`, the first step of its CLIP image processor
    (`do_convert_rgb`): an image with an alpha band or a transparent colour is composited over
    white with PIL's `alpha_composite`, any other mode is PIL's `convert("RGB")` (CMYK included)."""

    def __call__(self, img: Image.Image) -> Image.Image:
        if "A" in img.getbands() or img.info.get("transparency") is not None:
            white = Image.new("RGBA", img.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, img.convert("RGBA")).convert("RGB")
        return img.convert("RGB")
