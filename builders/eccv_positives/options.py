"""`counterfactory build eccv-positives` options (light: `--help` imports no datasets or torch).

`config_from_args` turns them into an `EccvImportConfig` (`config.py`), which `builder.from_args`
(also the `accelerate launch` entry point) builds with.
"""

from __future__ import annotations

import argparse

from builders.eccv_positives.config import EccvImportConfig
from builders.engine.option_types import non_negative_int
from builders.launch import add_source_image_arguments

HELP = "ECCV Caption / CxC / COCO positives (+ PM pseudo-positives) of COCO retrieval as Hub parquet"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--coco-root", default=None,
                        help="COCO download for images, caption texts and instances (optional: "
                             "without it rows hold ids only and there is no pm config)")
    parser.add_argument("--annotations-dir", default=None,
                        help="folder of positives in the eccv_caption file format (default: the "
                             "installed eccv_caption package; `counterfactory eccv ingest` writes one)")
    parser.add_argument("--pm-zeta", type=non_negative_int, default=0,
                        help="PM: max number of differing instance classes (paper PMRP: 0)")
    parser.add_argument("--no-pm", dest="with_pm", action="store_false", help="skip the pm config")
    add_source_image_arguments(parser)


def config_from_args(args: argparse.Namespace) -> EccvImportConfig:
    return EccvImportConfig(
        coco_root=str(args.coco_root) if args.coco_root else None,
        annotations_dir=str(args.annotations_dir) if args.annotations_dir else None,
        pm_zeta=args.pm_zeta, with_pm=args.with_pm, max_image_pixels=args.max_image_pixels)
