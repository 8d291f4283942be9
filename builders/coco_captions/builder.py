"""COCO retrieval sets: Karpathy splits of COCO as script-free Hub parquet with embedded images.

The simplest builder, and the evaluation data for the retrieval metrics: per Karpathy split, the
`default` config holds one row per image (image, ids, its captions, its boxes) and the `captions`
config one row per caption (the retrieval gallery / query list, keyed by COCO caption id, the ids
`eccv_caption` uses).

    counterfactory build coco-captions --coco-root COCO --splits test --output out/
    accelerate launch builders/coco_captions/builder.py --coco-root COCO --splits test --output out/
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from builders.coco_captions import options
from builders.coco_captions.card import CARD_FIELDS
from builders.coco_captions.config import CocoCaptionsConfig
from builders.coco_captions.schema import CAPTIONS, IMAGES
from builders.coco_captions.source import read_images
from builders.coco_captions.view import IMAGES_VIEW
from builders.engine import progress
from builders.engine.sharding.base import BuildInfo, Emit, OutputSpec, Skip
from loading_scripts.images import IMAGE_ENCODING


class CocoCaptionsBuilder:
    def __init__(self, config: CocoCaptionsConfig) -> None:
        self.config = config

    def outputs(self):
        return [
            spec
            for split in self.config.splits
            for spec in (
                OutputSpec("default", split, IMAGES, IMAGES_VIEW.to_dict()),
                OutputSpec("captions", split, CAPTIONS),
            )
        ]

    def work_items(self):
        return read_images(self.config)

    def source_option(self) -> str:
        return f"--coco-root {self.config.coco_root} (--splits {' '.join(self.config.splits)})"

    def process(self, items):
        from loading_scripts.images import ImageProblem, check_image

        for rec in progress.items(items, "images"):
            if not rec.captions:
                yield Skip("no_captions", kind="error", detail=f"image {rec.image_id}")
                continue
            try:
                # The annotated size must hold: the boxes are in its pixels.
                image = check_image(
                    rec.path, max_pixels=self.config.max_image_pixels, expected_size=(rec.width, rec.height)
                ).cell(self.config.strip_metadata)
            except ImageProblem as err:
                yield Skip(err.reason, kind="error", detail=str(err))
                continue
            split = rec.split
            yield Emit(
                f"default/{split}",
                {
                    "image": image,
                    "image_id": rec.image_id,
                    "file_name": rec.path.name,
                    "caption_ids": [c.caption_id for c in rec.captions],
                    "captions": [c.text for c in rec.captions],
                    "objects": [
                        {"category": o.category, "bbox": list(o.bbox), "iscrowd": o.iscrowd} for o in rec.objects
                    ],
                },
            )
            for cap in rec.captions:
                yield Emit(
                    f"captions/{split}", {"caption_id": cap.caption_id, "image_id": rec.image_id, "caption": cap.text}
                )

    def info(self):
        return BuildInfo(
            builder="coco-captions",
            card_template="dataset_card.md",
            pretty_name="COCO Karpathy retrieval splits",
            config={**asdict(self.config), "splits": list(self.config.splits), "image_encoding": IMAGE_ENCODING},
            card_fields=CARD_FIELDS,
        )


def from_args(args: argparse.Namespace) -> CocoCaptionsBuilder:
    """The builder of `counterfactory build coco-captions` (`builders.app.registry`) and of
    `accelerate launch` below, from the options (options.py, which never imports this module)."""
    return CocoCaptionsBuilder(options.config_from_args(args))


if __name__ == "__main__":
    from builders.launch import launch_main

    sys.exit(launch_main(options, from_args))
