"""`counterfactory build decorrelation` options (light: `--help` imports no torch, NLTK or datasets).

`config_from_args` turns them into a `DecorrelationConfig`, which
`builders.decorrelation.builder.from_args` (also the `accelerate launch` entry point) builds with.
The choice lists and configs live in `config.py`, light enough for `--help` to show them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from builders.decorrelation.config import (CAPTION_METHODS, DEFAULT_FLICKR_CLASSES, FILL_METHODS,
                                           PRODUCTS, VIEWS, CaptionConfig, DecorrelationConfig,
                                           FillConfig, SelectionConfig, SourceConfig, VerifyConfig)
from builders.engine.errors import UserFacingError
from builders.engine.option_types import fraction, non_negative_int, positive_int
from builders.engine.precision import add_dtype_argument
from builders.launch import add_source_image_arguments

HELP = "object-decorrelation sets: object-removal training pairs D' and the ODmAP@k test set"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from builders.models.profiles import add_model_arguments, add_profile_argument

    src = parser.add_argument_group("source").add_mutually_exclusive_group(required=True)
    src.add_argument("--coco-root", type=Path, help="root of a COCO download (with dataset_coco.json)")
    src.add_argument("--flickr30k-root", type=Path,
                     help="root of Flickr30k (dataset_flickr30k.json, flickr30k-images/, flickr30k_entities/)")
    p = parser.add_argument_group("what to build")
    p.add_argument("--products", nargs="+", choices=PRODUCTS, default=list(PRODUCTS),
                   help="train: D' pairs; odmap: ODmAP@k queries + gallery (default: both)")
    p.add_argument("--train-splits", nargs="+", default=["train", "restval"], help="Karpathy splits of D'")
    p.add_argument("--query-split", default="test", help="Karpathy split of the ODmAP queries")
    p.add_argument("--gallery-splits", nargs="+", default=["train", "restval", "val", "test"],
                   help="Karpathy splits whose captions form the ODmAP gallery")
    p.add_argument("--flickr-classes", nargs="+", default=list(DEFAULT_FLICKR_CLASSES),
                   help="Flickr30k Entities types treated as object classes")
    p.add_argument("--max-images", type=positive_int, default=None, help="first N images per split")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep-original", action="store_true", help="also store the source image per row")
    add_source_image_arguments(parser)
    r = parser.add_argument_group("selection rules (builders/decorrelation/METHOD.md §1)")
    r.add_argument("--alpha1", type=fraction, default=0.4, help="single-class removal below this overlap")
    r.add_argument("--alpha2", type=fraction, default=0.8, help="remove classes overlapping more than this")
    r.add_argument("--alpha3", type=fraction, default=0.7, help="skip regions larger than this image fraction")
    r.add_argument("--min-classes", type=positive_int, default=2, help="distinct classes an image needs")
    f = parser.add_argument_group("image synthesis (builders/decorrelation/METHOD.md §2)")
    f.add_argument("--fill", choices=FILL_METHODS, default="inpaint")
    f.add_argument("--fill-prompt", default="background", help="inpainting prompt")
    add_profile_argument(f, "--inpaint-steps", type=positive_int, default=50, tiny=2,
                         help="inpainting denoising steps")
    f.add_argument("--guidance-scale", type=float, default=7.5)
    add_profile_argument(f, "--image-size", type=positive_int, default=512, tiny=64,
                         help="inpainting working resolution (multiple of 8)")
    f.add_argument("--blur-radius", type=float, default=20.0, help="Gaussian blur radius (px) for --fill blur")
    f.add_argument("--mask-dilation", type=non_negative_int, default=FillConfig.mask_dilation, metavar="PIXELS",
                   help="grow the removed boxes by this many pixels on every side before filling "
                        "(default %(default)s; the selection rules use the boxes themselves)")
    v = parser.add_argument_group("removal check (builders/decorrelation/METHOD.md §2)")
    v.add_argument("--verify-removal", action=argparse.BooleanOptionalAction, default=None,
                   help="score each removed class with CLIP zero-shot before and after the fill and "
                        "skip rows where it is still visible (default: on for --fill inpaint with the "
                        "production models, off otherwise: the tiny CLIP is random)")
    v.add_argument("--verify-threshold", type=fraction, default=VerifyConfig.threshold,
                   help="a removed class still scoring this probability after the fill is visible "
                        "(default %(default)s)")
    v.add_argument("--verify-view", choices=VIEWS, default=VerifyConfig.view,
                   help="score a square crop around the filled region (default) or the whole image")
    c = parser.add_argument_group("caption synthesis (builders/decorrelation/METHOD.md §3)")
    c.add_argument("--caption", choices=CAPTION_METHODS, default="np_removal")
    c.add_argument("--captions-per-image", type=positive_int, default=1,
                   help="synthetic captions per synthetic image")
    c.add_argument("--caption-max-tokens", type=positive_int, default=30, help="captioner: max new tokens")
    add_model_arguments(parser, roles=("sd_inpaint", "captioner", "clip_filter"))
    add_dtype_argument(parser, "the inpainting pipeline and the CLIP removal check (the "
                               "captioner runs in fp32)")


def config_from_args(args: argparse.Namespace) -> DecorrelationConfig:
    from builders.models.profiles import profile_from_args

    verify = args.verify_removal
    if verify is None:  # the tiny profile's CLIP is random-init: its verdicts would mean nothing
        verify = args.fill == "inpaint" and args.models == "production"
    needs_models = (args.fill == "inpaint" or verify
                    or ("train" in args.products and args.caption == "captioner"))
    profile = profile_from_args(args) if needs_models else None
    kind, root = ("coco", args.coco_root) if args.coco_root else ("flickr30k", args.flickr30k_root)
    return DecorrelationConfig(
        source=SourceConfig(kind, Path(root), flickr_classes=tuple(args.flickr_classes),
                            max_images=args.max_images, max_image_pixels=args.max_image_pixels),
        products=tuple(args.products), train_splits=tuple(args.train_splits),
        query_split=args.query_split, gallery_splits=tuple(args.gallery_splits),
        selection=_checked(SelectionConfig, alpha1=args.alpha1, alpha2=args.alpha2,
                           alpha3=args.alpha3, min_classes=args.min_classes),
        fill=FillConfig(method=args.fill, model=profile.sd_inpaint if args.fill == "inpaint" else None,
                        prompt=args.fill_prompt, steps=args.inpaint_steps,
                        guidance_scale=args.guidance_scale, image_size=args.image_size,
                        blur_radius=args.blur_radius, mask_dilation=args.mask_dilation),
        caption=CaptionConfig(method=args.caption, captions_per_image=args.captions_per_image,
                              model=profile.captioner if args.caption == "captioner" and profile else None,
                              max_new_tokens=args.caption_max_tokens),
        verify=VerifyConfig(enabled=verify, model=profile.clip_filter if verify else None,
                            threshold=args.verify_threshold, view=args.verify_view),
        keep_original=args.keep_original, seed=args.seed)


def _checked(cls, **kwargs):
    """Build a config, turning its validation errors into one-line user errors."""
    try:
        return cls(**kwargs)
    except ValueError as err:
        raise UserFacingError(f"invalid option: {err}") from err
