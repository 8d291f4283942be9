"""The doctor's cross-encoder rows: each family the report scores (BLIP ITM base and large,
BridgeTower large ITM and ITC, ViLT, FLAVA ITM and contrastive: builders/models/families.py)
scoring image-caption pairs through the adapter the report uses
(builders/models/cross_encoders.py: the model's processor, then its ITM head), at its published
size with random weights (builders/models/production_families.py) or as the tiny profile's model.

At the production size the processor is the checkpoint's image preprocessing (its
`preprocessor_config.json`: BLIP 384 x 384, BridgeTower large 294 px shorter side, ViLT 384 px
shorter side, FLAVA 224 x 224) around the tiny family's tokenizer, as the CLIP rows take the tiny
CLIP's: the production vocabularies are larger, so every tiny id is a valid one, and the work of a
pair depends on its token count, not on which ids it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FamilyRow:
    """A doctor stage of one cross-encoder."""

    stage: str
    #: Its `production_families` architecture (the ModelSource key).
    arch: str
    #: Its tiny stand-in's folder under the tiny profile's families/.
    tiny: str
    #: The table's models column.
    models: str


FAMILY_ROWS = (
    FamilyRow("itm-blip-base", "blip_itm_base", "blip", "BLIP ITM base (ViT-B/16)"),
    FamilyRow("itm-blip-large", "blip_itm_large", "blip", "BLIP ITM large (ViT-L/16)"),
    FamilyRow("itm-bridgetower", "bridgetower_large_itm", "bridgetower", "BridgeTower large ITM"),
    FamilyRow("itc-bridgetower", "bridgetower_large_itc", "bridgetower-itc", "BridgeTower large ITC"),
    FamilyRow("itm-vilt", "vilt_coco", "vilt", "ViLT B/32 (COCO)"),
    FamilyRow("itm-flava", "flava_full", "flava", "FLAVA full (ITM head)"),
    FamilyRow("itc-flava", "flava_full_itc", "flava-itc", "FLAVA full (contrastive)"),
)
FAMILY_KEYS = tuple(row.arch for row in FAMILY_ROWS)


def _production_images(arch: str):
    """The checkpoint's image processor (its preprocessor_config.json's sizes)."""
    import transformers as tf

    return {
        "blip_itm_base": lambda: tf.BlipImageProcessor(size={"height": 384, "width": 384}),
        "blip_itm_large": lambda: tf.BlipImageProcessor(size={"height": 384, "width": 384}),
        "bridgetower_large_itm": lambda: tf.BridgeTowerImageProcessor(
            size={"shortest_edge": 294}, crop_size={"shortest_edge": 294}
        ),
        "bridgetower_large_itc": lambda: tf.BridgeTowerImageProcessor(
            size={"shortest_edge": 294}, crop_size={"shortest_edge": 294}
        ),
        "vilt_coco": lambda: tf.ViltImageProcessor(size={"shortest_edge": 384}, size_divisor=32),
        "flava_full": tf.FlavaImageProcessor,
        "flava_full_itc": tf.FlavaImageProcessor,
    }[arch]()


def cross_encoder(arch: str, tiny_root: Path, production: bool, device: str, dtype: str = "fp32"):
    """The report's backend of `arch` in `dtype` on `device`: its production architecture with
    random weights and the checkpoint's image processing, or the tiny profile's model of its
    family."""
    from builders.engine.precision import torch_dtype
    from builders.models.clip_ids import ClipId
    from builders.models.production_configs import build_random
    from builders.models.production_families import FAMILY_ARCH
    from builders.models.tiny_families import build_tiny_families
    from builders.models.cross_encoders import ADAPTERS, CrossEncoderBackend, load_cross_encoder

    row = next(r for r in FAMILY_ROWS if r.arch == arch)
    folder = build_tiny_families(tiny_root / "families")[row.tiny]
    family = FAMILY_ARCH[arch].family
    tiny = load_cross_encoder(ClipId("transformers", str(folder), str(folder)), family, device=device, dtype=dtype)
    if not production:
        return tiny
    processor = type(tiny.processor)(image_processor=_production_images(arch), tokenizer=tiny.processor.tokenizer)
    model = build_random(FAMILY_ARCH[arch]).to(device=device, dtype=torch_dtype(dtype))
    return CrossEncoderBackend(ClipId("transformers", arch, arch), ADAPTERS[family](model), processor)


def score_pairs(backend, image, captions: list[str]) -> tuple[int, str]:
    """G of `image` with each caption, one forward call: (pairs, a note with the input size)."""
    import torch

    inputs = backend.inputs([image] * len(captions), captions)
    with torch.no_grad():  # what `backend.score` runs, with the inputs kept for their sizes
        g = backend.module(**inputs).float().cpu()
    pixels = next((v for k, v in inputs.items() if k == "pixel_values"), None)
    size = "x".join(str(d) for d in pixels.shape[-2:]) if pixels is not None else "?"
    tokens = inputs["input_ids"].shape[-1]
    return len(captions), f"{backend.g_kind} {', '.join(f'{x:.3f}' for x in g.tolist())}; {size} px, {tokens} tokens"
