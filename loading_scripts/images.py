"""Opening source images: the one place that turns a file (or a cell's bytes) into RGB pixels or
a counted reason (`ImageProblem.reason`).

Checks, in order, before anything is decoded (`Image.open` reads the header only):
- `image_too_large`: more pixels than `max_pixels` (`--max-image-pixels`; PIL's own bomb limit,
  `Image.MAX_IMAGE_PIXELS`, still applies above it);
- `image_size_mismatch`: a size other than the annotation's `width` x `height` (boxes and masks
  would be wrong);
- `unreadable_image`: missing, truncated, or not an image;
- `image_values_out_of_range`: a float or 32-bit image whose values the policy below cannot map.

Every PIL mode becomes 8-bit RGB by one documented policy (docs/what-happens-when.md):
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

What a builder stores for a real image (`CheckedImage.cell`, `IMAGE_ENCODING`): the file's bytes as
read, as img2dataset does (a COCO JPEG stays that JPEG: a fraction of the bytes of its PNG, and
the trainer's `--fast-decode` applies), when a reader needs nothing the policy above decides to get
those RGB pixels from them: a single-frame 8-bit RGB JPEG or PNG, no transparency, no EXIF rotation
(`datasets` turns an image by its EXIF Orientation when it decodes it; the annotations are in the
file's own pixels) and no more than `stored_bytes_bound` bytes (trailing data is not published).
Any other image (one the policy converted, 16-bit colour, WebP, TIFF, ...) is stored as its
converted RGB pixels in PNG, lossless. The bytes as read keep the file's metadata (EXIF, a GPS
position included) unless the build's `--strip-metadata` drops it (`loading_scripts/image_metadata.py`). Images a builder generates stay PNG too (datasets' encoding
of a PIL image).
"""

from __future__ import annotations

import io
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator

import numpy as np
from PIL import ExifTags, Image, UnidentifiedImageError

from builders.engine.errors import InputFileError
from builders.engine.option_types import positive_int
from builders.engine.options import option
from loading_scripts.image_metadata import MetadataNotStripped
from loading_scripts.image_metadata import strip_metadata as strip_metadata_of

#: Default of `--max-image-pixels`: 40 Mpx (about 120 MB of decoded RGB), 60 times a COCO image
#: and below PIL's own bomb limit (89.5 Mpx), so a small file that decodes to gigabytes is refused.
DEFAULT_MAX_IMAGE_PIXELS = 40_000_000
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")
_ALPHA = ("LA", "PA", "RGBA", "La", "RGBa")
#: How builders store real images, recorded in their config (so the run fingerprint of a build
#: made before, which stored every image as PNG, differs: its parts are never mixed with these).
IMAGE_ENCODING = "as read when 8-bit RGB JPEG/PNG, else PNG"
#: How the cards' schema tables describe a column of real images.
STORED_AS = "its file's bytes as read when an 8-bit RGB JPEG or PNG, else converted to RGB and stored as PNG"
_STORED_AS_READ = ("JPEG", "PNG")
#: A PNG's first chunk (bytes 12..15) and its bit depth and colour type (bytes 24..25) for 8-bit
#: RGB: PIL opens 16-bit colour as "RGB" too (high bytes), which other readers decode to 16 bits.
_PNG_IHDR_RGB8 = (b"IHDR", b"\x08\x02")


def max_image_pixels_option() -> Any:
    """The `--max-image-pixels N` field of a builder's config (`builders.engine.options`), listed
    under "source images"."""
    return option(
        DEFAULT_MAX_IMAGE_PIXELS,
        "skip (and count as image_too_large) a source image of "
        "more pixels, checked from its header before decoding (default %(default)s)",
        group="source images",
        type=positive_int,
        metavar="N",
    )


class ImageProblem(InputFileError):
    """Why one image cannot be used; builders skip its row and count `reason`."""

    def __init__(self, path: object, reason: str, problem: str, fix: str) -> None:
        super().__init__(path, problem, fix)
        self.reason = reason


@dataclass(frozen=True)
class CheckedImage:
    """A source image that passed every check: its 8-bit RGB pixels, and the file's bytes when
    they can be stored as read (see the module docstring), else None."""

    pixels: Image.Image
    as_read: bytes | None

    def cell(self, strip_metadata: bool = False) -> dict[str, Any]:
        """What a `datasets.Image()` column stores for it: the bytes as read, else the pixels as
        PNG (encoded as datasets encodes a PIL image, so converted images are stored as before).
        With `strip_metadata` (`--strip-metadata`) the bytes as read lose their EXIF, XMP and
        comments (`image_metadata.strip_metadata`, lossless); a file whose segments cannot be
        rewritten is stored as its pixels in PNG, which carries none."""
        if self.as_read is not None:
            try:
                return {"bytes": strip_metadata_of(self.as_read) if strip_metadata else self.as_read, "path": None}
            except MetadataNotStripped:
                pass
        buf = io.BytesIO()
        self.pixels.save(buf, format="PNG")
        return {"bytes": buf.getvalue(), "path": None}


def stored_bytes_bound(pixels: int) -> int:
    """The most bytes a file of `pixels` pixels is stored as read with: twice its raw RGB size
    (no JPEG or PNG of real pixels comes near it) plus 1 MiB of metadata (EXIF, ICC profile)."""
    return 6 * pixels + (1 << 20)


def open_rgb_image(
    source: str | Path | bytes,
    *,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    expected_size: tuple[int, int] | None = None,
    name: str | None = None,
) -> Image.Image:
    """Decode `source` (a path, or the bytes of a dataset cell named `name`) as 8-bit RGB (the
    pixels of `check_image`)."""
    return check_image(source, max_pixels=max_pixels, expected_size=expected_size, name=name).pixels


def check_image(
    source: str | Path | bytes,
    *,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    expected_size: tuple[int, int] | None = None,
    name: str | None = None,
) -> CheckedImage:
    """Check and decode `source` (a path, or the bytes of a dataset cell named `name`).

    The header is checked against `max_pixels` and `expected_size` (width, height) before any
    pixel is decoded; the whole image is then loaded, so truncation is detected now. A file is
    read once: the bytes stored as read are the bytes checked."""
    where = (name or "image bytes") if isinstance(source, bytes) else Path(source)
    if not isinstance(source, bytes) and not Path(source).is_file():
        raise ImageProblem(
            where,
            "unreadable_image",
            "image file is missing",
            "check the image folder of the source, or re-download it",
        )
    try:
        with warnings.catch_warnings():
            # PIL only warns between its pixel limit and twice that; treat both as too large.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with _opened(source, max_pixels) as (fp, data), Image.open(fp) as img:
                _check_header(img, where, max_pixels, expected_size)
                img.load()
                return CheckedImage(_to_rgb(img, where), data if _stored_as_read(img, data) else None)
    except ImageProblem:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ImageProblem(
            where,
            "image_too_large",
            f"image is too large to decode safely ({err})",
            "check the file; raise PIL.Image.MAX_IMAGE_PIXELS only if you trust it",
        ) from err
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise ImageProblem(
            where,
            "unreadable_image",
            f"cannot decode the image ({err})",
            "re-download this file or remove it from the annotations",
        ) from err


@contextmanager
def _opened(source: str | Path | bytes, max_pixels: int) -> Iterator[tuple[IO[bytes], bytes | None]]:
    """The image to decode and its bytes; a file too large to be stored as read whatever its
    pixels is decoded from the file, not read into memory (None: no bytes to store)."""
    if isinstance(source, bytes):
        yield io.BytesIO(source), source
        return
    with open(source, "rb") as fh:
        if os.fstat(fh.fileno()).st_size > stored_bytes_bound(max_pixels):
            yield fh, None
        else:
            data = fh.read()
            yield io.BytesIO(data), data


def _stored_as_read(img: Image.Image, data: bytes | None) -> bool:
    """Whether `data` decode as they are to the pixels `_to_rgb` made of `img` (loaded): no
    conversion, rotation or bit depth a reader could apply differently."""
    if data is None or img.format not in _STORED_AS_READ or img.mode != "RGB":
        return False
    if "transparency" in img.info or getattr(img, "n_frames", 1) != 1:
        return False
    if img.format == "PNG" and (data[12:16], data[24:26]) != _PNG_IHDR_RGB8:
        return False
    if img.getexif().get(ExifTags.Base.Orientation, 1) != 1:
        return False
    return len(data) <= stored_bytes_bound(img.width * img.height)


def _check_header(img: Image.Image, where: object, max_pixels: int, expected_size: tuple[int, int] | None) -> None:
    width, height = img.size
    if width * height > max_pixels:
        raise ImageProblem(
            where,
            "image_too_large",
            f"{width}x{height} pixels, more than the {max_pixels} allowed",
            "raise --max-image-pixels if you trust the file",
        )
    if expected_size is not None and img.size != tuple(expected_size):
        raise ImageProblem(
            where,
            "image_size_mismatch",
            f"{width}x{height} pixels but annotated {expected_size[0]}x{expected_size[1]}",
            "fix the annotation's width/height or replace the image",
        )


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
            raise ImageProblem(
                where,
                "image_values_out_of_range",
                f"float image with values in [{np.nanmin(values)}, {np.nanmax(values)}], not in [0, 1]",
                "save it as an 8- or 16-bit image, or scale it to [0, 1]",
            )
        return np.rint(values.astype(np.float64) * 255).astype(np.uint8)
    if values.min(initial=0) < 0 or values.max(initial=0) > 65535:
        raise ImageProblem(
            where,
            "image_values_out_of_range",
            f"{img.mode} image with values in [{values.min()}, {values.max()}], not 16-bit (0..65535)",
            "save it as an 8- or 16-bit image",
        )
    return (values.astype(np.uint16) >> 8).astype(np.uint8)


def _gray_to_rgb(gray: np.ndarray) -> Image.Image:
    return Image.fromarray(np.repeat(gray[..., None], 3, axis=2))
