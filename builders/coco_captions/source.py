"""The COCO captions builder's source: the COCO records of each Karpathy split (`loading_scripts.coco`)."""

from __future__ import annotations

from pathlib import Path

from builders.coco_captions.config import CocoCaptionsConfig
from loading_scripts.records import SourceImage


def read_images(config: CocoCaptionsConfig) -> list[SourceImage]:
    """The first `max_images` records of each split, split by split (the builder's work items)."""
    from loading_scripts.coco import CocoSourceConfig, read_coco

    items: list[SourceImage] = []
    for split in config.splits:
        records = read_coco(CocoSourceConfig(Path(config.coco_root), karpathy_splits=(split,)))
        items += records[: config.max_images]
    return items
