"""`counterfactory build coco-captions` options (light: `--help` imports no datasets or torch).

`config_from_args` turns them into a `CocoCaptionsConfig` (`builders.coco_captions.config`), which
`builders.coco_captions.builder.from_args` (also the `accelerate launch` entry point) builds with.
"""

from __future__ import annotations

import argparse

from builders.coco_captions.config import KARPATHY_SPLITS, CocoCaptionsConfig
from builders.engine.option_types import positive_int
from builders.launch import add_source_image_arguments

HELP = "COCO Karpathy splits (images + captions + boxes) as Hub parquet"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--coco-root", required=True, help="root of a COCO download")
    parser.add_argument("--splits", nargs="+", default=["test"],
                        choices=KARPATHY_SPLITS, help="Karpathy splits")
    parser.add_argument("--max-images", type=positive_int, default=None, help="first N images per split")
    add_source_image_arguments(parser)


def config_from_args(args: argparse.Namespace) -> CocoCaptionsConfig:
    return CocoCaptionsConfig(coco_root=str(args.coco_root), splits=tuple(args.splits),
                              max_images=args.max_images, max_image_pixels=args.max_image_pixels)
