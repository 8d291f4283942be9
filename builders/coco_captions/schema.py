"""The COCO captions tables: `default` (one row per image) and `captions` (one row per caption)."""

from __future__ import annotations

import datasets

from loading_scripts.images import STORED_AS

IMAGES = datasets.Features(
    {
        "image": datasets.Image(),
        "image_id": datasets.Value("int64"),
        "file_name": datasets.Value("string"),
        "caption_ids": datasets.List(datasets.Value("int64")),
        "captions": datasets.List(datasets.Value("string")),
        "objects": datasets.List(
            {
                "category": datasets.Value("string"),
                "bbox": datasets.List(datasets.Value("float32"), length=4),
                "iscrowd": datasets.Value("int8"),
            }
        ),
    }
)
CAPTIONS = datasets.Features(
    {
        "caption_id": datasets.Value("int64"),
        "image_id": datasets.Value("int64"),
        "caption": datasets.Value("string"),
    }
)
COLUMN_DOCS = {
    "image": f"the COCO image: {STORED_AS}",
    "image_id": "COCO image id",
    "caption_id": "COCO caption id",
    "objects": "COCO instance boxes (x, y, w, h in pixels)",
}
