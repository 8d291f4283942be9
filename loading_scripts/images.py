"""Opening source images: one place that turns a broken file into an error naming it."""

from __future__ import annotations

import warnings
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from builders.infra.errors import InputFileError


def open_rgb_image(path: str | Path) -> Image.Image:
    """Load an image fully (so truncation is detected now, not later) and convert it to RGB."""
    path = Path(path)
    if not path.is_file():
        raise InputFileError(path, "image file is missing",
                             "check the image folder of the source, or re-download it")
    try:
        with warnings.catch_warnings():
            # PIL only warns between its pixel limit and twice that; treat both as too large.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                img.load()
                return img.convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise InputFileError(path, f"image is too large to decode safely ({err})",
                             "check the file; raise PIL.Image.MAX_IMAGE_PIXELS only if you trust it") from err
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise InputFileError(path, f"cannot decode the image ({err})",
                             "re-download this file or remove it from the annotations") from err
