"""What a COCO captions build makes: its one typed config (no heavy import, so `--help` stays light)."""

from __future__ import annotations

from dataclasses import dataclass

from loading_scripts.images import DEFAULT_MAX_IMAGE_PIXELS

#: Karpathy's splits of COCO, the choices of `--splits`.
KARPATHY_SPLITS = ("train", "restval", "val", "test")


@dataclass
class CocoCaptionsConfig:
    """Example: `CocoCaptionsConfig(coco_root="coco", splits=("test",))`."""

    #: Root of a COCO download (see `loading_scripts.coco`).
    coco_root: str
    #: Karpathy splits to build (`train`, `restval`, `val`, `test`).
    splits: tuple[str, ...] = ("test",)
    #: Keep only the first N images of each split (by image id); None keeps all.
    max_images: int | None = None
    #: Skip (count `image_too_large`) images of more pixels, checked before decoding.
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
