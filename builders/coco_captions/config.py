"""What a COCO captions build makes: its one typed config, whose fields are the flags of
`counterfactory build coco-captions` (`builders.engine.options`; no heavy import, so `--help`
stays light)."""

from __future__ import annotations

from dataclasses import dataclass

from builders.engine.option_types import positive_int
from builders.engine.options import option
from loading_scripts.image_metadata import strip_metadata_option
from loading_scripts.images import max_image_pixels_option

#: Karpathy's splits of COCO, the choices of `--splits`.
KARPATHY_SPLITS = ("train", "restval", "val", "test")


@dataclass
class CocoCaptionsConfig:
    """Example: `CocoCaptionsConfig(coco_root="coco", splits=("test",))`."""

    #: Root of a COCO download (see `loading_scripts.coco`).
    coco_root: str = option(help="root of a COCO download")
    #: Karpathy splits to build (`train`, `restval`, `val`, `test`).
    splits: tuple[str, ...] = option(("test",), "Karpathy splits", choices=KARPATHY_SPLITS)
    #: Keep only the first N images of each split (by image id); None keeps all.
    max_images: int | None = option(None, "first N images per split", type=positive_int)
    #: Skip (count `image_too_large`) images of more pixels, checked before decoding.
    max_image_pixels: int = max_image_pixels_option()
    #: Drop the source images' EXIF (GPS included), XMP and comments, losslessly (their bytes
    #: are stored as read otherwise: `loading_scripts/images.py`).
    strip_metadata: bool = strip_metadata_option()
