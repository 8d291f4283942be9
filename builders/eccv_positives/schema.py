"""The tables of an eccv-positives build (`i2t/test`, `t2i/test`, `pm/i2t`, `pm/t2i`,
`removed/test`) and what each column means (the card's column table)."""

from __future__ import annotations

import datasets

from loading_scripts.images import STORED_AS

_IDS = datasets.List(datasets.Value("int64"))
_TEXTS = datasets.List(datasets.Value("string"))
I2T = datasets.Features(
    {
        "image": datasets.Image(),
        "image_id": datasets.Value("int64"),
        "file_name": datasets.Value("string"),
        "eccv_query": datasets.Value("bool"),
        "positive_caption_ids": _IDS,
        "positive_captions": _TEXTS,
        "positive_sources": _TEXTS,
        "cxc_caption_ids": _IDS,
        "coco_caption_ids": _IDS,
    }
)
T2I = datasets.Features(
    {
        "caption": datasets.Value("string"),
        "caption_id": datasets.Value("int64"),
        "image_id": datasets.Value("int64"),
        "eccv_query": datasets.Value("bool"),
        "positive_image_ids": _IDS,
        "positive_sources": _TEXTS,
        "cxc_image_ids": _IDS,
        "coco_image_ids": _IDS,
    }
)
# One schema for both splits (a config has one): split i2t holds image queries -> caption ids,
# split t2i caption queries -> image ids.
PM = datasets.Features({"query_id": datasets.Value("int64"), "pm_positive_ids": _IDS})
REMOVED = datasets.Features(
    {
        "kind": datasets.Value("string"),
        "id": datasets.Value("int64"),
        "reason": datasets.Value("string"),
        "text": datasets.Value("string"),
    }
)

COLUMN_DOCS = {
    "image_id": "COCO image id (for t2i: the caption's original image)",
    "caption_id": "COCO caption id",
    "eccv_query": "whether the row is a query of the ECCV positive set (else: CxC/COCO only)",
    "positive_caption_ids": "ECCV positives of the image query, in annotation-file order",
    "positive_image_ids": "ECCV positives of the caption query, in annotation-file order",
    "positive_captions": "texts of positive_caption_ids (null when the COCO root lacks them)",
    "positive_sources": "per positive: coco (original pair), cxc (CxC), eccv (MITL-verified only)",
    "cxc_caption_ids": "CxC positives (null: not a CxC query)",
    "cxc_image_ids": "CxC positives (null: not a CxC query)",
    "coco_caption_ids": "original COCO positives (null: not a COCO query)",
    "coco_image_ids": "original COCO positives (null: not a COCO query)",
    "query_id": "pm: image id (split i2t) or caption id (split t2i)",
    "pm_positive_ids": "pm: plausible-match captions (i2t) / images (t2i), own image excluded",
    "image": f"COCO image (null when the COCO root lacks it): {STORED_AS}",
    "caption": "caption text (null when the COCO root lacks it)",
}
