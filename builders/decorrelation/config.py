"""What a decorrelation build makes: its products, source, selection rules, fill, removal check
and caption settings, as typed dataclasses under `DecorrelationConfig`, and the constants they
validate against (builders/decorrelation/METHOD.md).

No heavy import: their `option()` fields are the flags of `counterfactory build decorrelation`
(`builders.engine.options`; `--help` loads no torch), and `TINY` holds the sizes that go with
`--models tiny`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from builders.engine.errors import UserFacingError
from builders.engine.option_types import (
    check_image_side,
    fraction,
    non_negative_int,
    non_negative_number,
    positive_int,
    seed_int,
    steps_int,
)
from builders.engine.options import option
from builders.engine.precision import dtype_option
from builders.models.profiles import tiny_preset
from loading_scripts.flickr30k import ENTITY_TYPES
from loading_scripts.image_metadata import strip_metadata_option
from loading_scripts.images import max_image_pixels_option

#: `train`: the object-removal pairs D'; `odmap`: the ODmAP@k queries and gallery.
PRODUCTS = ("train", "odmap")
#: How y' is made (builders/decorrelation/METHOD.md §3).
CAPTION_METHODS = ("np_removal", "prompts", "captioner")
#: Flickr30k Entities types treated as object classes by default.
DEFAULT_FLICKR_CLASSES = ("people", "animals", "vehicles", "instruments")
SOURCES = ("coco", "flickr30k")
#: How a removed region is filled: an inpainting model or a baseline (METHOD.md §2).
FILL_METHODS = ("inpaint", "zero", "mean", "blur")
#: What the removal check scores: a square crop around the filled region, or the whole image.
VIEWS = ("region", "image")
#: Help group of the options that say what to build.
WHAT = "what to build"
#: The 80 prompt templates of CLIP's ImageNet zero-shot evaluation (as in open_clip's
#: `OPENAI_IMAGENET_TEMPLATES`), kept here so a library update cannot change built captions.
CLIP_TEMPLATES: tuple[str, ...] = (
    "a bad photo of a {}.",
    "a photo of many {}.",
    "a sculpture of a {}.",
    "a photo of the hard to see {}.",
    "a low resolution photo of the {}.",
    "a rendering of a {}.",
    "graffiti of a {}.",
    "a bad photo of the {}.",
    "a cropped photo of the {}.",
    "a tattoo of a {}.",
    "the embroidered {}.",
    "a photo of a hard to see {}.",
    "a bright photo of a {}.",
    "a photo of a clean {}.",
    "a photo of a dirty {}.",
    "a dark photo of the {}.",
    "a drawing of a {}.",
    "a photo of my {}.",
    "the plastic {}.",
    "a photo of the cool {}.",
    "a close-up photo of a {}.",
    "a black and white photo of the {}.",
    "a painting of the {}.",
    "a painting of a {}.",
    "a pixelated photo of the {}.",
    "a sculpture of the {}.",
    "a bright photo of the {}.",
    "a cropped photo of a {}.",
    "a plastic {}.",
    "a photo of the dirty {}.",
    "a jpeg corrupted photo of a {}.",
    "a blurry photo of the {}.",
    "a photo of the {}.",
    "a good photo of the {}.",
    "a rendering of the {}.",
    "a {} in a video game.",
    "a photo of one {}.",
    "a doodle of a {}.",
    "a close-up photo of the {}.",
    "a photo of a {}.",
    "the origami {}.",
    "the {} in a video game.",
    "a sketch of a {}.",
    "a doodle of the {}.",
    "a origami {}.",
    "a low resolution photo of a {}.",
    "the toy {}.",
    "a rendition of the {}.",
    "a photo of the clean {}.",
    "a photo of a large {}.",
    "a rendition of a {}.",
    "a photo of a nice {}.",
    "a photo of a weird {}.",
    "a blurry photo of a {}.",
    "a cartoon {}.",
    "art of a {}.",
    "a sketch of the {}.",
    "a embroidered {}.",
    "a pixelated photo of a {}.",
    "itap of the {}.",
    "a jpeg corrupted photo of the {}.",
    "a good photo of a {}.",
    "a plushie {}.",
    "a photo of the nice {}.",
    "a photo of the small {}.",
    "a photo of the weird {}.",
    "the cartoon {}.",
    "art of the {}.",
    "a drawing of the {}.",
    "a photo of the large {}.",
    "a black and white photo of a {}.",
    "the plushie {}.",
    "a dark photo of a {}.",
    "itap of a {}.",
    "graffiti of the {}.",
    "a toy {}.",
    "itap of my {}.",
    "a photo of a cool {}.",
    "a photo of a small {}.",
    "a tattoo of the {}.",
)


@dataclass(frozen=True)
class SourceConfig:
    """Example: `SourceConfig(kind="coco", root=Path("coco"))`."""

    kind: str
    root: Path
    #: Flickr30k only: the entity types that count as object classes.
    flickr_classes: tuple[str, ...] = option(
        DEFAULT_FLICKR_CLASSES, "Flickr30k Entities types treated as object classes", group=WHAT
    )
    #: Keep only the first N images (by image id) of each split; None keeps all.
    max_images: int | None = option(None, "first N images per split", group=WHAT, type=positive_int)
    #: Skip (count `image_too_large`) images of more pixels, checked before decoding.
    max_image_pixels: int = max_image_pixels_option()
    #: Drop the source images' EXIF (GPS included), XMP and comments, losslessly (their bytes
    #: are stored as read otherwise: `loading_scripts/images.py`).
    strip_metadata: bool = strip_metadata_option()

    def __post_init__(self) -> None:
        if self.kind not in SOURCES:
            raise UserFacingError(f"unknown source {self.kind!r}; choose one of {', '.join(SOURCES)}")
        unknown = set(self.flickr_classes) - set(ENTITY_TYPES)
        if self.kind == "flickr30k" and unknown:
            raise UserFacingError(
                f"--flickr-classes {sorted(unknown)} are not Flickr30k Entities types ({', '.join(ENTITY_TYPES)})"
            )

    @property
    def class_names(self) -> tuple[str, ...]:
        """The classes of the mention vectors, in column order."""
        if self.kind == "coco":
            from counterfactory_metrics.odmap.class_match import COCO_CLASSES

            return COCO_CLASSES
        return tuple(self.flickr_classes)


@dataclass(frozen=True)
class SelectionConfig:
    """Thresholds of builders/decorrelation/METHOD.md §1 (defaults are the paper's)."""

    #: Single-class removal when every other class overlaps the removed region by less than this.
    alpha1: float = option(0.4, "single-class removal below this overlap", type=fraction)
    #: Classes overlapping the removed region by more than this are removed with it.
    alpha2: float = option(0.8, "remove classes overlapping more than this", type=fraction)
    #: Skip a removal whose region covers more than this fraction of the image.
    alpha3: float = option(0.7, "skip regions larger than this image fraction", type=fraction)
    #: Images need at least this many distinct classes (with pixels) to be considered.
    min_classes: int = option(2, "distinct classes an image needs", type=positive_int)

    def __post_init__(self) -> None:
        for name in ("alpha1", "alpha2", "alpha3"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.alpha1 > self.alpha2:
            raise ValueError(f"alpha1 ({self.alpha1}) must not exceed alpha2 ({self.alpha2})")
        if self.min_classes < 2:
            raise ValueError(f"min_classes must be at least 2, got {self.min_classes}")


@dataclass(frozen=True)
class FillConfig:
    """How removed regions are filled. Example: `FillConfig(method="blur", blur_radius=8)`."""

    method: str = option("inpaint", flag="--fill", choices=FILL_METHODS)
    #: Inpainting model id or local folder (the profile's `sd_inpaint`); only for `inpaint`.
    model: str | None = None
    #: Text prompt of the inpainting model: a neutral scene word, not an object.
    prompt: str = option("background", "inpainting prompt", flag="--fill-prompt")
    steps: int = option(50, "inpainting denoising steps", flag="--inpaint-steps", type=steps_int)
    guidance_scale: float = option(7.5, type=non_negative_number)
    #: Square working resolution of the inpainting model (multiple of 8).
    image_size: int = option(512, "inpainting working resolution (multiple of 8)", type=positive_int)
    #: Gaussian blur radius in pixels for `blur`.
    blur_radius: float = option(20.0, "Gaussian blur radius (px) for --fill blur")
    #: Pixels the removed region is grown by on every side before filling (0 = the boxes only).
    mask_dilation: int = option(
        4,
        "grow the removed boxes by this many pixels on every side before filling (default "
        "%(default)s; the selection rules use the boxes themselves)",
        type=non_negative_int,
        metavar="PIXELS",
    )

    def __post_init__(self) -> None:
        if self.method not in FILL_METHODS:
            raise UserFacingError(f"unknown fill method {self.method!r}; choose one of {', '.join(FILL_METHODS)}")
        if self.method == "inpaint":
            if not self.model:
                raise UserFacingError("--fill inpaint needs an inpainting model (--sd-inpaint-model or --models)")
            check_image_side(self.image_size, 8, "--image-size", "the inpainting model's VAE")
            if self.steps < 1:
                raise UserFacingError(f"--inpaint-steps must be at least 1, got {self.steps}")
        if self.mask_dilation < 0:
            raise UserFacingError(f"--mask-dilation must be 0 or more pixels, got {self.mask_dilation}")
        if self.method == "blur" and self.blur_radius <= 0:
            raise UserFacingError(f"--blur-radius must be positive, got {self.blur_radius}")

    @property
    def model_id(self) -> str | None:
        """The model that made the pixels (recorded per row), None for the baselines."""
        return self.model if self.method == "inpaint" else None


@dataclass(frozen=True)
class VerifyConfig:
    """The removal check. Example: `VerifyConfig(enabled=True, model="openai/clip-vit-large-patch14")`."""

    enabled: bool = option(
        False,
        "score each removed class with CLIP zero-shot before and after the fill and skip "
        "rows where it is still visible (default: on for --fill inpaint with the "
        "production models, off otherwise: the tiny CLIP is random)",
        flag="--verify-removal",
        action=argparse.BooleanOptionalAction,
    )
    #: transformers CLIP id or folder (the profile's `clip_filter`: not the ViT-B/32 that ODmAP
    #: is usually reported with, so the check does not pick queries in that model's favour).
    model: str | None = None
    #: A removed class scoring at least this (after the fill) is still visible.
    threshold: float = option(
        0.3,
        "a removed class still scoring this probability after the fill is visible (default %(default)s)",
        flag="--verify-threshold",
        type=fraction,
    )
    #: `region`: a square crop around the filled region; `image`: the whole image.
    view: str = option(
        "region",
        "score a square crop around the filled region (default) or the whole image",
        flag="--verify-view",
        choices=VIEWS,
    )
    #: Context around the region, as a fraction of its longer side added on each side.
    context: float = 0.25
    prompt: str = "a photo of a {}."

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        if not self.model:
            raise UserFacingError("--verify-removal needs a CLIP model (--clip-filter-model or --models)")
        if not 0.0 <= self.threshold <= 1.0:
            raise UserFacingError(f"--verify-threshold must be in [0, 1], got {self.threshold}")
        if self.view not in VIEWS:
            raise UserFacingError(f"--verify-view takes {', '.join(VIEWS)} (got {self.view!r})")
        if self.context < 0:
            raise UserFacingError(f"--verify-context must be 0 or more, got {self.context}")
        if self.prompt.count("{}") != 1:
            raise UserFacingError(f"--verify-prompt needs exactly one '{{}}' for the class name, got {self.prompt!r}")


@dataclass(frozen=True)
class CaptionConfig:
    """How y' is made. Example: `CaptionConfig(method="prompts", captions_per_image=2)`."""

    method: str = option("np_removal", flag="--caption", choices=CAPTION_METHODS)
    #: Synthetic captions (hence rows) per synthetic image.
    captions_per_image: int = option(1, "synthetic captions per synthetic image", type=positive_int)
    #: Captioner model id or local folder (the profile's `captioner`); only for `captioner`.
    model: str | None = None
    max_new_tokens: int = option(30, "captioner: max new tokens", flag="--caption-max-tokens", type=positive_int)

    def __post_init__(self) -> None:
        if self.method not in CAPTION_METHODS:
            raise UserFacingError(
                f"unknown caption method {self.method!r}; choose one of {', '.join(CAPTION_METHODS)}"
            )
        if self.captions_per_image < 1:
            raise UserFacingError(f"--captions-per-image must be at least 1, got {self.captions_per_image}")
        if self.method == "prompts" and self.captions_per_image > len(CLIP_TEMPLATES):
            raise UserFacingError(f"--captions-per-image is at most {len(CLIP_TEMPLATES)} with prompts")
        if self.method == "captioner":
            if not self.model:
                raise UserFacingError("--caption captioner needs a captioning model (--captioner-model or --models)")
            if self.captions_per_image != 1:
                raise UserFacingError(
                    "--caption captioner decodes greedily: one caption per image; use --captions-per-image 1"
                )

    @property
    def model_id(self) -> str | None:
        return self.model if self.method == "captioner" else None


@dataclass
class DecorrelationConfig:
    """What to build. Example (no models needed):
    `DecorrelationConfig(source=SourceConfig("coco", Path("coco")), fill=FillConfig("blur"))`.
    The command line defaults to `--fill inpaint` with the profile's inpainting model."""

    source: SourceConfig
    fill: FillConfig
    #: Which products: `train` (D') and/or `odmap` (queries + gallery).
    products: tuple[str, ...] = option(
        PRODUCTS, "train: D' pairs; odmap: ODmAP@k queries + gallery (default: both)", choices=PRODUCTS
    )
    #: Karpathy splits D' is built from (the paper's COCO "train" is train + restval).
    train_splits: tuple[str, ...] = option(("train", "restval"), "Karpathy splits of D'")
    #: The split the ODmAP queries come from.
    query_split: str = option("test", "Karpathy split of the ODmAP queries")
    #: Splits whose captions form the ODmAP gallery (builders/decorrelation/METHOD.md §5: train + val + test).
    gallery_splits: tuple[str, ...] = option(
        ("train", "restval", "val", "test"), "Karpathy splits whose captions form the ODmAP gallery"
    )
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    caption: CaptionConfig = field(default_factory=CaptionConfig)
    #: CLIP check that removed classes are gone from x' (off unless asked for; the command line
    #: turns it on for inpainting with the production profile).
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    #: Also store the source image in each row (off: it doubles the size).
    keep_original: bool = option(False, "also store the source image per row")
    seed: int = option(0, type=seed_int)
    #: The precision of the inpainting pipeline and the removal check: how the build runs, so
    #: `info` records it resolved on the device (`precision`) instead.
    dtype: str = dtype_option(
        "the inpainting pipeline and the CLIP removal check (the captioner runs in fp32)", group="options"
    )

    def __post_init__(self) -> None:
        unknown = set(self.products) - set(PRODUCTS)
        if not self.products or unknown:
            raise UserFacingError(f"--products takes {', '.join(PRODUCTS)} (got {list(self.products)})")
        if "train" in self.products and self.query_split in self.train_splits and "odmap" in self.products:
            raise UserFacingError(
                f"the query split {self.query_split!r} must not be a training split "
                f"({list(self.train_splits)}): ODmAP queries must be unseen images"
            )


#: The sizes that go with `--models tiny` (builders.models.profiles): a random-init inpainter
#: makes nothing better at 512 px and 50 steps, only slower.
TINY = tiny_preset(DecorrelationConfig, {"fill": {"steps": 2, "image_size": 64}})
