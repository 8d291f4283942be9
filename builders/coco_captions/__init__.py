"""COCO captions: the real image-caption pairs D that the other datasets are measured against.

COCO root (Karpathy split file, images, captions, instances; `loading_scripts.coco`) → one row per
image with its captions and boxes (`builder.py`; its gallery view in `view.py`) → Hub-layout
parquet with embedded images.
"""
