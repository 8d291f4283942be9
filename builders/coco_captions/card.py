"""The fields the shared card machinery reads for a COCO captions build."""

from __future__ import annotations

from builders.coco_captions.schema import COLUMN_DOCS

CARD_FIELDS = {
    "license": "cc-by-4.0",
    "task_categories": ["image-to-text", "text-to-image"],
    "tags": ["coco", "retrieval"],
    "source_datasets": ["MS-COCO"],
    "summary": "MS-COCO images with their captions and boxes, in Karpathy's splits, "
    "as parquet with embedded images (no loading script).",
    "column_docs": COLUMN_DOCS,
    "limitations": ["Images keep the COCO license terms of their Flickr sources."],
    "citation": "@inproceedings{lin2014microsoft, title={Microsoft COCO: Common "
    "Objects in Context}, author={Lin, Tsung-Yi and others}, "
    "booktitle={ECCV}, year={2014}}",
}
