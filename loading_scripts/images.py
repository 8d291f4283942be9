"""Opening source images: the one place that turns a file (or a cell's bytes) into RGB pixels or
a counted reason (`ImageProblem.reason`).

Checks, in order, before anything is decoded (`Image.open` reads the header only):
- `image_too_large`: more pixels than `max_pixels` (`--max-image-pixels`; PIL's own bomb limit,
  `Image.MAX_IMAGE_PIXELS`, still applies above it);
- `image_size_mismatch`: a size other than the annotation's `width` x `height` (boxes and masks
  would be wrong);
- `unreadable_image`: missing, truncated, or not an image;
- `image_values_out_of_range`: a float or 32-bit image whose values the policy below cannot map.

Every PIL mode becomes 8-bit RGB by one documented policy (README "What happens when…"):
- RGB as is; `1`, `L`, `P` without transparency, `CMYK` (R = (255-C)(255-K)/255, rounded) and
  `YCbCr` (JPEG's full-range BT.601) by PIL's conversions;
- transparency (`LA`, `PA`, `RGBA`, `La`, `RGBa`, `P`/`L`/`RGB` with a transparent colour) is
  composited over white: out = (c*a + 255*(255-a)) / 255, rounded;
- 16-bit samples (`I;16`, `I;16B`, `I;16L`, `I;16N`) keep their high byte (v >> 8), as PIL itself
  does for 16-bit colour PNGs; `I` (32-bit) is read as 16-bit data (0..65535, what PIL gives some
  16-bit files), any other value is `image_values_out_of_range`; a transparent colour of a
  16-bit or float image is ignored;
- `F` (32-bit float) is read as 0..1 and scaled by 255, rounded; values outside [0, 1] (or NaN)
  are `image_values_out_of_range`, never clipped.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from builders.engine.errors import InputFileError

#: Default of `--max-image-pixels`: 40 Mpx (about 120 MB of decoded RGB), 60 times a COCO image
#: and below PIL's own bomb limit (89.5 Mpx), so a small file that decodes to gigabytes is refused.
DEFAULT_MAX_IMAGE_PIXELS = 40_000_000
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")
_ALPHA = ("LA", "PA", "RGBA", "La", "RGBa")


class ImageProblem(InputFileError):
    """Why one image cannot be used; builders skip its row and count `reason`."""

    def __init__(self, path: object, reason: str, problem: str, fix: str) -> None:
        super().__init__(path, problem, fix)
        self.reason = reason


def open_rgb_image(source: str | Path | bytes, *, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
                   expected_size: tuple[int, int] | None = None, name: str | None = None) -> Image.Image:
    """Decode `source` (a path, or the bytes of a dataset cell named `name`) as 8-bit RGB.

    The header is checked against `max_pixels` and `expected_size` (width, height) before any
    pixel is decoded; the whole image is then loaded, so truncation is detected now."""
    where = (name or "image bytes") if isinstance(source, bytes) else Path(source)
    if not isinstance(source, bytes) and not Path(source).is_file():
        raise ImageProblem(where, "unreadable_image", "image file is missing",
                           "check the image folder of the source, or re-download it")
    try:
        with warnings.catch_warnings():
            # PIL only warns between its pixel limit and twice that; treat both as too large.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as img:
                _check_header(img, where, max_pixels, expected_size)
                img.load()
                return _to_rgb(img, where)
    except ImageProblem:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ImageProblem(where, "image_too_large", f"image is too large to decode safely ({err})",
                           "check the file; raise PIL.Image.MAX_IMAGE_PIXELS only if you trust it") from err
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise ImageProblem(where, "unreadable_image", f"cannot decode the image ({err})",
                           "re-download this file or remove it from the annotations") from err


def _check_header(img: Image.Image, where: object, max_pixels: int,
                  expected_size: tuple[int, int] | None) -> None:
    width, height = img.size
    if width * height > max_pixels:
        raise ImageProblem(where, "image_too_large", f"{width}x{height} pixels, more than the "
                           f"{max_pixels} allowed", "raise --max-image-pixels if you trust the file")
    if expected_size is not None and img.size != tuple(expected_size):
        raise ImageProblem(where, "image_size_mismatch", f"{width}x{height} pixels but annotated "
                           f"{expected_size[0]}x{expected_size[1]}",
                           "fix the annotation's width/height or replace the image")


def _to_rgb(img: Image.Image, where: object) -> Image.Image:
    """8-bit RGB by the module's documented policy (a loaded image of any PIL mode)."""
    if img.mode in _SIXTEEN_BIT or img.mode in ("I", "F"):
        return _gray_to_rgb(_eight_bit(img, where))
    if img.mode in _ALPHA or "transparency" in img.info:
        rgba = np.asarray(img.convert("RGBA"), dtype=np.uint16)
        alpha = rgba[..., 3:]
        # (c*a + 255*(255-a)) / 255 rounded: x // 255 after adding 127 rounds (x/255 never ends in
        # .5); x = 65025 - a*(255-c) <= 65025, so 16 bits hold it.
        out = (rgba[..., :3] * alpha + 255 * (255 - alpha) + 127) // 255
        return Image.fromarray(out.astype(np.uint8))
    return img.convert("RGB")  # a copy even for RGB: the caller closes the file's image


def _eight_bit(img: Image.Image, where: object) -> np.ndarray:
    values = np.asarray(img)
    if img.mode == "F":
        if not (np.isfinite(values).all() and values.min(initial=0) >= 0 and values.max(initial=0) <= 1):
            raise ImageProblem(where, "image_values_out_of_range", "float image with values in "
                               f"[{np.nanmin(values)}, {np.nanmax(values)}], not in [0, 1]",
                               "save it as an 8- or 16-bit image, or scale it to [0, 1]")
        return np.rint(values.astype(np.float64) * 255).astype(np.uint8)
    if values.min(initial=0) < 0 or values.max(initial=0) > 65535:
        raise ImageProblem(where, "image_values_out_of_range", f"{img.mode} image with values in "
                           f"[{values.min()}, {values.max()}], not 16-bit (0..65535)",
                           "save it as an 8- or 16-bit image")
    return (values.astype(np.uint16) >> 8).astype(np.uint8)


def _gray_to_rgb(gray: np.ndarray) -> Image.Image:
    return Image.fromarray(np.repeat(gray[..., None], 3, axis=2))
