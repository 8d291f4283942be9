"""The trainer's image inputs equal each backend's reference preprocessing (transformers'
`CLIPImageProcessor`, open_clip's eval transform) within 1 grey level on photo-sized JPEGs, at
CLIP's real input size and through the tiny models' backends; `--fast-decode` is the opt-in that
does not."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from builders.models.clip_ids import parse_clip_id
from training.backends import load_backend, open_clip_pixels, transformers_pixels
from training.data import decode_image

#: COCO's common shapes, and 427x640 whose crop margin is odd (transformers and torchvision
#: round the centre crop's offset differently there).
SHAPES = [(640, 480), (480, 640), (427, 640), (500, 333)]


def photo_jpeg(width: int, height: int, seed: int) -> bytes:
    """Gradients + noise, as a photo-like JPEG (quality 90)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    arr = np.stack([xx * 255 / width, yy * 255 / height, (xx + yy) * 255 / (width + height)], -1)
    arr = arr + rng.normal(0, 30, (height, width, 3))
    buf = io.BytesIO()
    Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def ours(pixels, data: bytes, fast_decode: bool = False) -> torch.Tensor:
    """What the trainer feeds the model: the worker half, then the per-batch half."""
    return pixels.per_batch(decode_image(data, pixels.per_image(), pixels.size, fast_decode)[None])[0]


def grey_levels(a: torch.Tensor, b: torch.Tensor, std) -> torch.Tensor:
    """|a - b| un-normalised to 0..255 grey levels."""
    return ((a - b) * torch.tensor(std).view(3, 1, 1) * 255).abs()


def hf_reference(processor, data: bytes) -> torch.Tensor:
    img = Image.open(io.BytesIO(data))
    return torch.as_tensor(np.asarray(processor(img, return_tensors="np")["pixel_values"][0]))


def oc_reference(preprocess, data: bytes) -> torch.Tensor:
    return preprocess(Image.open(io.BytesIO(data)))


@pytest.mark.parametrize("shape", SHAPES)
def test_inputs_equal_the_reference_processors_at_clip_size(shape):
    from transformers import CLIPImageProcessor
    import open_clip

    data = photo_jpeg(*shape, seed=shape[0])
    hf = CLIPImageProcessor()  # openai/clip-vit-base-patch32's: short side 224, crop 224, bicubic
    pixels = transformers_pixels(hf)
    diff = grey_levels(ours(pixels, data), hf_reference(hf, data), hf.image_std)
    assert diff.max() <= 1.0 + 1e-4, (shape, float(diff.max()))

    preprocess = open_clip.image_transform(224, is_train=False)
    cfg = {"mean": open_clip.OPENAI_DATASET_MEAN, "std": open_clip.OPENAI_DATASET_STD}
    pixels = open_clip_pixels(preprocess, 224, cfg)
    diff = grey_levels(ours(pixels, data), oc_reference(preprocess, data), cfg["std"])
    assert diff.max() <= 1.0 + 1e-4, (shape, float(diff.max()))


def test_fast_decode_is_the_approximate_opt_in():
    """Draft-mode decoding is what the default no longer does: several grey levels off."""
    from transformers import CLIPImageProcessor

    data = photo_jpeg(640, 480, seed=1)
    hf = CLIPImageProcessor()
    ref = hf_reference(hf, data)
    fast = grey_levels(ours(transformers_pixels(hf), data, fast_decode=True), ref, hf.image_std)
    assert fast.mean() > 1.0 and fast.max() > 10


@pytest.mark.parametrize("kind", ["transformers", "open_clip"])
def test_backends_use_their_own_reference_preprocessing(kind, tiny_models_dir):
    """Through `load_backend` (the tiny models: input 32 px, so a 640x480 JPEG is downscaled 15x)."""
    from builders.models.loaders import load_open_clip
    from builders.models.profiles import tiny_profile

    profile = tiny_profile(tiny_models_dir)
    backend = load_backend(parse_clip_id(profile.clip if kind == "transformers" else profile.open_clip, kind))
    if kind == "transformers":
        processor, std = backend._extra.image_processor, backend._extra.image_processor.image_std
        reference = lambda data: hf_reference(processor, data)  # noqa: E731
    else:
        _, preprocess, _ = load_open_clip(parse_clip_id(profile.open_clip, "open_clip"))
        std = backend.pixels.std
        reference = lambda data: oc_reference(preprocess, data)  # noqa: E731
    for shape in SHAPES:
        data = photo_jpeg(*shape, seed=7)
        diff = grey_levels(ours(backend.pixels, data), reference(data), std)
        assert diff.max() <= 1.0 + 1e-4, (shape, float(diff.max()))
