"""The one record type every source reader returns: an image with its captions and boxes.

`read_coco` and `read_flickr30k` both return `SourceImage` records (paths, sizes, captions, boxes;
no pixels), sorted by image id, which the builders shard as their work items. What only one
source has is an optional field: COCO's category ids, areas and crowd flags on `SourceObject`,
Flickr30k Entities' phrase spans on `SourceCaption`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builders.engine.errors import InputProblem


@dataclass(frozen=True)
class EntityPhrase:
    """A Flickr30k Entities phrase: character span [start, end) in the caption text, entity id,
    types."""

    start: int
    end: int
    entity_id: int
    types: tuple[str, ...]


@dataclass(frozen=True)
class SourceCaption:
    caption_id: int
    text: str
    #: Flickr30k Entities phrase spans (empty for COCO, whose phrases come from NLTK).
    phrases: tuple[EntityPhrase, ...] = ()
    #: Set when the caption is not usable text (not a string, blank, invalid Unicode).
    input_problem: InputProblem | None = None


@dataclass(frozen=True)
class SourceObject:
    """A box: `category` is a COCO class name or a Flickr30k Entities type."""

    category: str
    #: x, y, width, height in pixels (COCO convention).
    bbox: tuple[float, float, float, float]
    #: COCO: the annotation id. Flickr30k: the Entities entity id (an entity may have several boxes).
    object_id: int | None = None
    #: COCO only: the category id, the annotated area and the crowd flag (0 or 1).
    category_id: int | None = None
    area: float | None = None
    iscrowd: int = 0


@dataclass(frozen=True)
class SourceImage:
    image_id: int
    path: Path
    width: int
    height: int
    #: The Karpathy split (`train`, `restval`, `val`, `test`); for COCO read without Karpathy's
    #: file, the image folder.
    split: str
    #: The image folder under the source root (`val2014`, `flickr30k-images`).
    folder: str
    captions: tuple[SourceCaption, ...]
    objects: tuple[SourceObject, ...] = ()
    #: The image's first malformed field, if any: builders skip the image and count the reason
    #: (builders.engine.errors.InputProblem).
    input_problem: InputProblem | None = None
