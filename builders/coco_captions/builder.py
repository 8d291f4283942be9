"""COCO retrieval sets: Karpathy splits of COCO as script-free Hub parquet with embedded images.

The simplest builder, and the evaluation data for the retrieval metrics: per Karpathy split, the
`default` config holds one row per image (image, ids, its captions, its boxes) and the `captions`
config one row per caption (the retrieval gallery / query list, keyed by COCO caption id, the ids
`eccv_caption` uses).

    counterfactory build coco-captions --coco-root COCO --splits test --output out/
    accelerate launch builders/coco_captions/builder.py --coco-root COCO --splits test --output out/
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import datasets

from builders.engine import progress
from builders.engine.sharding.base import BuildInfo, Emit, OutputSpec, Skip
from builders.coco_captions.view import IMAGES_VIEW
from loading_scripts.images import DEFAULT_MAX_IMAGE_PIXELS

IMAGES = datasets.Features({
    "image": datasets.Image(),
    "image_id": datasets.Value("int64"),
    "file_name": datasets.Value("string"),
    "caption_ids": datasets.List(datasets.Value("int64")),
    "captions": datasets.List(datasets.Value("string")),
    "objects": datasets.List({
        "category": datasets.Value("string"),
        "bbox": datasets.List(datasets.Value("float32"), length=4),
        "iscrowd": datasets.Value("int8"),
    }),
})
CAPTIONS = datasets.Features({
    "caption_id": datasets.Value("int64"),
    "image_id": datasets.Value("int64"),
    "caption": datasets.Value("string"),
})


@dataclass
class CocoCaptionsConfig:
    """Example: `CocoCaptionsConfig(coco_root="coco", splits=("test",))`."""

    #: Root of a COCO download (see `loading_scripts.coco`).
    coco_root: str
    #: Karpathy splits to build (`train`, `restval`, `val`, `test`).
    splits: tuple[str, ...] = ("test",)
    #: Keep only the first N images of each split (by image id); None keeps all.
    max_images: int | None = None
    #: Skip (count `image_too_large`) images of more pixels, checked before decoding.
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS


class CocoCaptionsBuilder:
    def __init__(self, config: CocoCaptionsConfig) -> None:
        self.config = config

    def outputs(self):
        return [spec for split in self.config.splits
                for spec in (OutputSpec("default", split, IMAGES, IMAGES_VIEW.to_dict()),
                             OutputSpec("captions", split, CAPTIONS))]

    def work_items(self):
        from loading_scripts.coco import CocoSourceConfig, read_coco

        items = []
        for split in self.config.splits:
            records = read_coco(CocoSourceConfig(Path(self.config.coco_root), karpathy_splits=(split,)))
            items += records[: self.config.max_images]
        return items

    def process(self, items):
        from loading_scripts.images import ImageProblem, open_rgb_image

        for rec in progress.items(items, "images"):
            if not rec.captions:
                yield Skip("no_captions", kind="error", detail=f"image {rec.image_id}")
                continue
            try:
                # The annotated size must hold: the boxes are in its pixels.
                image = open_rgb_image(rec.path, max_pixels=self.config.max_image_pixels,
                                       expected_size=(rec.width, rec.height))
            except ImageProblem as err:
                yield Skip(err.reason, kind="error", detail=str(err))
                continue
            split = rec.split
            yield Emit(f"default/{split}", {
                "image": image, "image_id": rec.image_id, "file_name": rec.path.name,
                "caption_ids": [c.caption_id for c in rec.captions],
                "captions": [c.text for c in rec.captions],
                "objects": [{"category": o.category, "bbox": list(o.bbox), "iscrowd": o.iscrowd}
                            for o in rec.objects],
            })
            for cap in rec.captions:
                yield Emit(f"captions/{split}", {"caption_id": cap.caption_id,
                                                 "image_id": rec.image_id, "caption": cap.text})

    def info(self):
        return BuildInfo(
            builder="coco-captions", card_template="dataset_card.md",
            pretty_name="COCO Karpathy retrieval splits",
            config={**asdict(self.config), "splits": list(self.config.splits)},
            card_fields={
                "license": "cc-by-4.0",
                "task_categories": ["image-to-text", "text-to-image"],
                "tags": ["coco", "retrieval"],
                "source_datasets": ["MS-COCO"],
                "summary": "MS-COCO images with their captions and boxes, in Karpathy's splits, "
                           "as parquet with embedded images (no loading script).",
                "column_docs": {"image_id": "COCO image id", "caption_id": "COCO caption id",
                                "objects": "COCO instance boxes (x, y, w, h in pixels)"},
                "limitations": ["Images keep the COCO license terms of their Flickr sources."],
                "citation": "@inproceedings{lin2014microsoft, title={Microsoft COCO: Common "
                            "Objects in Context}, author={Lin, Tsung-Yi and others}, "
                            "booktitle={ECCV}, year={2014}}",
            },
        )


if __name__ == "__main__":
    from builders.coco_captions import options
    from builders.launch import launch_main

    sys.exit(launch_main(options))
