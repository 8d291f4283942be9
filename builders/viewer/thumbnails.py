"""Thumbnails: each image of a row is written once as a small JPEG file next to the pages.

Files (not base64 inside the pages) keep every page small whatever the build size, and the
browser fetches only the thumbnails it shows (`loading="lazy"`). A decorrelation mask is drawn as
a red outline on the synthetic image's thumbnail, so the replaced region is visible at a glance.
Thumbnails are never enlarged; tiny images (the 64 px fixture builds) are scaled up by the page.

Images are read from a cell's bytes only. A cell holding just a `path` is never opened: the path
comes from the dataset (maybe someone else's, from the Hub) and may name any file of the user's,
which the gallery would then embed. Such a cell, and bytes that cannot be shown (truncated,
undecodable, more pixels than `max_pixels`), raise `ThumbnailProblem` with a counted reason; the
gallery shows the image as missing.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageChops, ImageFilter

#: Rows per thumbnail folder, so no folder holds tens of thousands of files.
ROWS_PER_FOLDER = 1000
OUTLINE_RGB = (255, 40, 40)
#: PIL's own decompression-bomb limit (1024 * 1024 * 1024 // 4 // 3 pixels, 256 MB as RGB).
MAX_PIXELS = 89_478_485
#: Why an image is not shown, the reasons counted on the stats page.
PATH_ONLY = "path_only"
EMPTY = "empty"
TRUNCATED = "truncated"
UNDECODABLE = "undecodable"
TOO_MANY_PIXELS = "too_many_pixels"


class ThumbnailProblem(Exception):
    """An image cell that cannot be shown: `reason` (counted) and what was found (`detail`)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class ThumbnailConfig:
    """Example: `ThumbnailConfig(max_side=160, quality=80)`."""

    #: Longest side in pixels (smaller images keep their size); the page shows them 160 px wide.
    max_side: int = 160
    #: JPEG quality (1-95).
    quality: int = 80
    #: Images with more pixels are not decoded (shown as missing, `too_many_pixels`).
    max_pixels: int = MAX_PIXELS


def decode_image(value: Any, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """The decoded image of a `datasets` Image cell ({"bytes", "path"}, undecoded), from its bytes
    only; `ThumbnailProblem` when it cannot be shown."""
    data = value.get("bytes") if isinstance(value, dict) else None
    if not data:
        if isinstance(value, dict) and value.get("path"):
            raise ThumbnailProblem(PATH_ONLY, f"no bytes, only the path {value['path']!r} (not read)")
        raise ThumbnailProblem(EMPTY, "neither bytes nor a path")
    try:
        with warnings.catch_warnings():
            # Above PIL's limit `open` only warns, and decoding would then allocate it all.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            if image.width * image.height > max_pixels:
                raise ThumbnailProblem(
                    TOO_MANY_PIXELS, f"{image.width}x{image.height} pixels, more than {max_pixels:,}"
                )
            image.load()
    except ThumbnailProblem:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ThumbnailProblem(TOO_MANY_PIXELS, str(err)) from None
    except Exception as err:  # noqa: BLE001 - PIL's decoders raise many types on hostile bytes
        reason = TRUNCATED if "truncated" in str(err).lower() else UNDECODABLE
        raise ThumbnailProblem(reason, f"{type(err).__name__}: {err}") from None
    return image


def outline(mask: Image.Image, size: tuple[int, int], width: int = 2) -> Image.Image:
    """L-mode image, 255 on the border of the mask's region (scaled to `size`)."""
    region = mask.convert("L").resize(size, Image.Resampling.NEAREST).point(lambda v: 255 if v >= 128 else 0)
    inner = region.filter(ImageFilter.MinFilter(2 * width + 1))
    return ImageChops.subtract(region, inner)


def write_thumbnail(
    image: Image.Image, path: Path, cfg: ThumbnailConfig, mask: Image.Image | None = None
) -> dict[str, Any]:
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
