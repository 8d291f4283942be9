"""Thumbnails: each image of a row is written once as a small JPEG file next to the pages.

Files (not base64 inside the pages) keep every page small whatever the build size, and the
browser fetches only the thumbnails it shows (`loading="lazy"`). A decorrelation mask is drawn as
a red outline on the synthetic image's thumbnail, so the replaced region is visible at a glance.
Thumbnails are never enlarged; tiny images (the 64 px fixture builds) are scaled up by the page.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageChops, ImageFilter

from builders.infra.errors import InputFileError

#: Rows per thumbnail folder, so no folder holds tens of thousands of files.
ROWS_PER_FOLDER = 1000
OUTLINE_RGB = (255, 40, 40)


@dataclass(frozen=True)
class ThumbnailConfig:
    """Example: `ThumbnailConfig(max_side=160, quality=80)`."""

    #: Longest side in pixels (smaller images keep their size); the page shows them 160 px wide.
    max_side: int = 160
    #: JPEG quality (1-95).
    quality: int = 80


def open_image(value: Any, where: str) -> Image.Image:
    """A PIL image from a `datasets` Image cell ({"bytes", "path"}, undecoded)."""
    data = value.get("bytes") if isinstance(value, dict) else None
    try:
        if data:
            return Image.open(io.BytesIO(data))
        if isinstance(value, dict) and value.get("path"):
            return Image.open(value["path"])
    except OSError as err:
        raise InputFileError(where, f"image cannot be read ({err})", "rebuild this row") from None
    raise InputFileError(where, "image cell holds neither bytes nor a path", "rebuild this row")


def outline(mask: Image.Image, size: tuple[int, int], width: int = 2) -> Image.Image:
    """L-mode image, 255 on the border of the mask's region (scaled to `size`)."""
    region = mask.convert("L").resize(size, Image.Resampling.NEAREST).point(lambda v: 255 if v >= 128 else 0)
    inner = region.filter(ImageFilter.MinFilter(2 * width + 1))
    return ImageChops.subtract(region, inner)


def write_thumbnail(image: Image.Image, path: Path, cfg: ThumbnailConfig,
                    mask: Image.Image | None = None) -> dict[str, Any]:
    """Write `image` (with `mask` outlined) as a JPEG; return its {"w", "h"} in pixels."""
    thumb = image.convert("RGB")
    # Bicubic halves Lanczos' cost at thumbnail sizes with no visible difference.
    thumb.thumbnail((cfg.max_side, cfg.max_side), Image.Resampling.BICUBIC)
    if mask is not None:
        thumb.paste(OUTLINE_RGB, (0, 0), outline(mask, thumb.size))
    path.parent.mkdir(parents=True, exist_ok=True)
    # 4:4:4 chroma: with the default 4:2:0 the thin red outline bleeds into its neighbours.
    thumb.save(path, "JPEG", quality=cfg.quality, subsampling=0)
    return {"w": thumb.width, "h": thumb.height}


def thumbnail_path(index: int, slot: int) -> str:
    """Relative path of row `index`'s `slot`-th thumbnail."""
    return f"thumbs/{index // ROWS_PER_FOLDER:04d}/{index:07d}_{slot}.jpg"
