"""`counterfactory fixture coco|flickr30k DIR [--images N] [--seed S]`, `fixture classification DIR`."""

from __future__ import annotations

import argparse
from pathlib import Path

from builders.engine.option_types import positive_int, seed_int


def _classification(args: argparse.Namespace) -> int:
    from builders.devtools.fixtures.classification import CLASSES, write_classification_fixture

    root = write_classification_fixture(args.dir, per_class=args.per_class, seed=args.seed)
    print(f"wrote a classification fixture of {len(CLASSES)} classes x {args.per_class} images to {root}")
    return 0


def _handler(args: argparse.Namespace) -> int:
    from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture, write_flickr30k_fixture

    cfg = CocoFixtureConfig(n_images=args.images, seed=args.seed, release=args.release)
    write = write_coco_fixture if args.kind == "coco" else write_flickr30k_fixture
    print(f"wrote a {args.kind} fixture of {args.images} images to {write(args.dir, cfg)}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("fixture", help="write a tiny synthetic source dataset for tests/demos")
    kinds = p.add_subparsers(dest="kind", metavar="KIND", required=True)
    for kind, what in (
        (
            "coco",
            "COCO layout: train2014/val2014 JPEGs, captions_*.json, instances_*.json, Karpathy dataset_coco.json",
        ),
        ("flickr30k", "Flickr30k layout: flickr30k-images/*.jpg, Karpathy dataset_flickr30k.json"),
    ):
        k = kinds.add_parser(
            kind,
            help=f"tiny {kind} source",
            description=f"Write a tiny {what}. "
            "Images are synthetic, objects are drawn at their annotated boxes; "
            "the output is a deterministic function of --seed.",
        )
        k.add_argument("dir", type=Path, help="output folder")
        k.add_argument("--images", type=positive_int, default=24, help="number of images (default 24)")
        k.add_argument("--seed", type=seed_int, default=0, help="random seed (default 0)")
        k.add_argument(
            "--release",
            choices=("2014", "2017"),
            default="2014",
            help="COCO folder layout: train2014/val2014 (default) or train2017/val2017",
        )
        k.set_defaults(func=_handler)
    k = kinds.add_parser(
        "classification",
        help="tiny image-classification source (imagefolder)",
        description="Write a tiny imagefolder DIR/test/CLASS/N.jpg (7 COCO classes) "
        "for zero-shot evaluation (`train --zeroshot DIR`).",
    )
    k.add_argument("dir", type=Path, help="output folder")
    k.add_argument("--per-class", type=positive_int, default=3, help="images per class (default 3)")
    k.add_argument("--seed", type=seed_int, default=0, help="random seed (default 0)")
    k.set_defaults(func=_classification)
