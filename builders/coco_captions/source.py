"""The COCO captions builder's source: the COCO records of each Karpathy split (`loading_scripts.coco`)."""

from __future__ import annotations

from pathlib import Path

from builders.coco_captions.config import CocoCaptionsConfig
from loading_scripts.records import SourceImage


def read_images(config: CocoCaptionsConfig) -> list[SourceImage]:
    """The first `max_images` records of each split, split by split (the builder's work items).

    One read for all splits: Karpathy's splits share COCO folders (val and test both live in
    val2014), so a read per split parsed the same annotation files once per split."""
    from loading_scripts.coco import CocoSourceConfig, read_coco

    records = read_coco(CocoSourceConfig(Path(config.coco_root), karpathy_splits=tuple(config.splits)))
    by_split: dict[str, list[SourceImage]] = {split: [] for split in config.splits}
    for rec in records:  # sorted by image id, as each split's own read was
        by_split[rec.split].append(rec)
    return [rec for split in config.splits for rec in by_split[split][: config.max_images]]
