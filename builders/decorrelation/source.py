"""The decorrelation builder's source: COCO or Flickr30k, read by `loading_scripts`.

`read_source(cfg, splits)` returns the readers' `SourceImage` records (paths, boxes, captions; no
pixels), sorted by image id, which are the builder's work items. COCO boxes carry the 80 COCO classes;
Flickr30k boxes come from Flickr30k Entities and carry its entity types, restricted to
`flickr_classes` (builders/decorrelation/METHOD.md §4: the paper used 4 Flickr30k classes without naming them; our default
is the four object-like types people, animals, vehicles, instruments — clothing and body parts
sit on people, and scene / other are not objects).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from builders.decorrelation.config import SourceConfig
from builders.engine.errors import UserFacingError
from loading_scripts.records import SourceImage


def read_source(cfg: SourceConfig, splits: tuple[str, ...]) -> list[SourceImage]:
    """All images of `splits`, sorted by image id."""
    records = _read_coco(cfg, splits) if cfg.kind == "coco" else _read_flickr(cfg, splits)
    if cfg.max_images is not None:
        kept: dict[str, int] = {}
        limited = []
        for rec in records:
            if kept.get(rec.split, 0) < cfg.max_images:
                kept[rec.split] = kept.get(rec.split, 0) + 1
                limited.append(rec)
        records = limited
    return records


def _read_coco(cfg: SourceConfig, splits: tuple[str, ...]) -> list[SourceImage]:
    from loading_scripts.coco import CocoSourceConfig, read_coco

    return read_coco(CocoSourceConfig(Path(cfg.root), karpathy_splits=splits))


def _read_flickr(cfg: SourceConfig, splits: tuple[str, ...]) -> list[SourceImage]:
    from loading_scripts.flickr30k import Flickr30kSourceConfig, read_flickr30k

    # Flickr30k's Karpathy split has no restval: its train split is the whole training set.
    wanted = tuple(s for s in dict.fromkeys("train" if s == "restval" else s for s in splits))
    records = read_flickr30k(Flickr30kSourceConfig(Path(cfg.root), splits=wanted))
    if records and not any(c.phrases for r in records for c in r.captions):
        raise UserFacingError(
            f"{cfg.root}: Flickr30k needs Flickr30k Entities (boxes and phrase types) for object "
            "removal; put it in ROOT/flickr30k_entities (https://github.com/BryanPlummer/flickr30k_entities)"
        )
    classes = set(cfg.flickr_classes)
    return [replace(r, objects=tuple(o for o in r.objects if o.category in classes)) for r in records]
