"""Images with transparency, a palette or CMYK reach the model as each backend's reference makes
them (issue #34 §3): transformers' `CLIPImageProcessor` composites transparency over white before
resizing; open_clip resizes, crops or pads in the image's own mode and converts to RGB last. The
trainer's worker path (`decode_image` + the backend's steps + the per-batch half) is compared with
both references on RGBA, LA and transparent-palette PNGs and a CMYK JPEG, with open_clip's three
resize modes, at CLIP's input size and through the tiny models' backends."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from builders.models.clip_ids import parse_clip_id
from training.backends import load_backend, open_clip_pixels, transformers_pixels
from training.data import decode_image

MODES = ["RGBA", "LA", "P", "CMYK"]
#: A landscape photo and a portrait one whose crop margin is odd.
SHAPES = [(640, 480), (427, 640)]


def photo(width: int, height: int, seed: int) -> np.ndarray:
    """Gradients + noise, a photo-like RGB array."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    arr = np.stack([xx * 255 / width, yy * 255 / height, (xx + yy) * 255 / (width + height)], -1)
    return (arr + rng.normal(0, 30, (height, width, 3))).clip(0, 255).astype(np.uint8)


def encoded(mode: str, width: int, height: int, seed: int = 0) -> bytes:
    """A PNG (RGBA, LA, P with a transparent index) or a JPEG (CMYK) of mode `mode`: a fully
    transparent band (dark colour underneath), an alpha ramp and an opaque band."""
    rgb = photo(width, height, seed)
    alpha = np.tile(np.linspace(0, 255, width).astype(np.uint8), (height, 1))
    alpha[:, : width // 4] = 0
    alpha[height // 3 : height // 2] = 255
    buf = io.BytesIO()
    if mode == "RGBA":
        Image.fromarray(np.dstack([rgb, alpha]), "RGBA").save(buf, format="PNG")
    elif mode == "LA":
        Image.fromarray(np.dstack([rgb[..., 0], alpha]), "LA").save(buf, format="PNG")
    elif mode == "P":
        quantized = Image.fromarray(rgb).quantize(63)
        index = np.asarray(quantized) + 1
        index[:, : width // 3] = 0  # index 0: black, transparent
        img = Image.fromarray(index.astype(np.uint8), "P")
        img.putpalette([0, 0, 0] + quantized.getpalette()[: 63 * 3])
        img.save(buf, format="PNG", transparency=0)
    else:
        Image.fromarray(rgb).convert("CMYK").save(buf, format="JPEG", quality=90)
    data = buf.getvalue()
    opened = Image.open(io.BytesIO(data))
    assert opened.mode == mode and (mode != "P" or opened.info.get("transparency") == 0)
    return data


def ours(pixels, data: bytes) -> torch.Tensor:
    """What the trainer feeds the model: the worker half, then the per-batch half."""
    return pixels.per_batch(decode_image(data, pixels.per_image(), pixels.size)[None])[0]


def rgb_first(pixels, data: bytes) -> torch.Tensor:
    """The old path: the image converted to RGB (alpha dropped) before the backend's steps."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    img.info.pop("transparency", None)
    return pixels.per_batch(pixels.per_image()(img)[None])[0]


def grey_levels(a: torch.Tensor, b: torch.Tensor, std) -> torch.Tensor:
    """|a - b| un-normalised to 0..255 grey levels."""
    return ((a - b) * torch.tensor(std).view(3, 1, 1) * 255).abs()


def hf_reference(processor, data: bytes) -> torch.Tensor:
    img = Image.open(io.BytesIO(data))
    return torch.as_tensor(np.asarray(processor(img, return_tensors="np")["pixel_values"][0]))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", MODES)
def test_transformers_inputs_composite_transparency_on_white_as_clip_image_processor(mode, shape):
    from transformers import CLIPImageProcessor

    data = encoded(mode, *shape)
    hf = CLIPImageProcessor()  # openai/clip-vit-base-patch32's: short side 224, crop 224, bicubic
    pixels = transformers_pixels(hf)
    ref = hf_reference(hf, data)
    diff = grey_levels(ours(pixels, data), ref, hf.image_std)
    # transformers resizes a tensor, we resize PIL: within 1 grey level, as for RGB photos.
    assert diff.max() <= 1.0 + 1e-4, (mode, shape, float(diff.max()))
    if mode != "CMYK":  # the fixture exercises the case: dropping alpha first is far off
        assert grey_levels(rgb_first(pixels, data), ref, hf.image_std).max() > 20


@pytest.mark.parametrize("resize_mode", ["shortest", "longest", "squash"])
@pytest.mark.parametrize("mode", MODES)
def test_open_clip_inputs_convert_after_resize_and_pad_as_its_transform(mode, resize_mode):
    import open_clip

    preprocess = open_clip.image_transform(224, is_train=False, resize_mode=resize_mode)
    cfg = {"mean": open_clip.OPENAI_DATASET_MEAN, "std": open_clip.OPENAI_DATASET_STD}
    pixels = open_clip_pixels(preprocess, 224, cfg)
    for shape in SHAPES:
        data = encoded(mode, *shape)
        ref = preprocess(Image.open(io.BytesIO(data)))
        diff = grey_levels(ours(pixels, data), ref, cfg["std"])
        assert diff.max() <= 1e-3, (mode, resize_mode, shape, float(diff.max()))
        old = grey_levels(rgb_first(pixels, data), ref, cfg["std"])
        if mode != "CMYK" or resize_mode == "longest":  # CMYK: its padding is white in CMYK
            assert old.max() > 20, (mode, resize_mode, shape, float(old.max()))


@pytest.mark.parametrize("kind", ["transformers", "open_clip"])
def test_backends_preprocess_every_mode_as_their_reference(kind, tiny_models_dir):
    """Through `load_backend` (the tiny models: input 32 px)."""
    from builders.models.loaders import load_open_clip
    from builders.models.profiles import tiny_profile

    profile = tiny_profile(tiny_models_dir)
    backend = load_backend(parse_clip_id(profile.clip if kind == "transformers" else profile.open_clip, kind))
    if kind == "transformers":
        processor = backend._extra.image_processor
        std, reference, tolerance = processor.image_std, lambda d: hf_reference(processor, d), 1.0 + 1e-4
    else:
        _, preprocess, _ = load_open_clip(parse_clip_id(profile.open_clip, "open_clip"))
        std, reference, tolerance = backend.pixels.std, lambda d: preprocess(Image.open(io.BytesIO(d))), 1e-3
    for mode in MODES:
        data = encoded(mode, 640, 480, seed=3)
        diff = grey_levels(ours(backend.pixels, data), reference(data), std)
        assert diff.max() <= tolerance, (kind, mode, float(diff.max()))
