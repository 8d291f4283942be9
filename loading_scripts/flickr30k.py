"""Reader of Flickr30k: Karpathy's split file, the images, and (optionally) Flickr30k Entities.

Expected layout:

    ROOT/flickr30k-images/<id>.jpg
    ROOT/dataset_flickr30k.json                 Karpathy split (train 29,000 / val 1,014 / test 1,000)
    ROOT/flickr30k_entities/Sentences/<id>.txt  optional: phrase <-> entity type per caption
    ROOT/flickr30k_entities/Annotations/<id>.xml optional: boxes per entity (PASCAL VOC style)

An Entities sentence line looks like
`[/EN#18/people A man] with [/EN#19/clothing pierced ears] is wearing [/EN#20/clothing glasses] .`;
its phrases carry the entity types (people, clothing, bodyparts, animals, vehicles, instruments,
scene, other). A box belongs to every entity named in its `<object>`; its class is the entity's
first type (the few multi-typed entities, e.g. `people/other`, are rare). Boxes are converted to
COCO (x, y, width, height) with width = xmax - xmin. Entity boxes marked `nobndbox` or `scene` are
not boxes and are skipped. Without Entities, captions come from Karpathy's `raw` sentences and
images have no boxes.

`read_flickr30k(Flickr30kSourceConfig(root, splits=("test",)))` returns `SourceImage` records
(`loading_scripts.records`: paths, boxes, captions with phrase spans; no pixels).

A `filename` must name a file inside `flickr30k-images/` or elsewhere inside ROOT, after `..` and
symlinks (`builders.engine.contained_paths`; the folder itself may be a symlink): one that leads
outside is never stat'ed or opened, its record's `input_problem` is `path_outside_root`.
"""

from __future__ import annotations

import logging
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from builders.engine.contained_paths import ContainedPaths
from builders.engine.errors import InputFileError, InputProblem
from loading_scripts.coco import load_json
from loading_scripts.records import EntityPhrase, SourceCaption, SourceImage, SourceObject

log = logging.getLogger(__name__)

DOWNLOAD_FIX = (
    "get Flickr30k from https://shannon.cs.illinois.edu/DenotationGraph/, Karpathy's "
    "dataset_flickr30k.json, and optionally https://github.com/BryanPlummer/flickr30k_entities"
)
SPLITS = ("train", "val", "test")
IMAGES_FOLDER = "flickr30k-images"
ENTITY_TYPES = ("people", "clothing", "bodyparts", "animals", "vehicles", "instruments", "scene", "other")
_PHRASE = re.compile(r"\[/EN#(\d+)((?:/[^\s\]]+)+) ([^\]]*)\]")


@dataclass
class Flickr30kSourceConfig:
    """Example: `Flickr30kSourceConfig(root=Path("f30k"), splits=("test",))`."""

    root: Path
    #: Karpathy splits to read; default: all.
    splits: tuple[str, ...] = SPLITS
    #: Karpathy split file; default `ROOT/dataset_flickr30k.json`.
    karpathy_file: Path | None = None
    #: Flickr30k Entities folder; default `ROOT/flickr30k_entities` when it exists, else none.
    entities_dir: Path | None = None


def parse_entity_sentence(line: str) -> tuple[str, tuple[EntityPhrase, ...]]:
    """Plain text and phrase spans of one Entities sentence line."""
    line = line.strip()
    text, phrases, pos = [], [], 0
    length = 0
    for m in _PHRASE.finditer(line):
        before = line[pos : m.start()]
        text.append(before)
        length += len(before)
        phrase = m.group(3)
        types = tuple(t for t in m.group(2).split("/") if t)
        phrases.append(EntityPhrase(length, length + len(phrase), int(m.group(1)), types))
        text.append(phrase)
        length += len(phrase)
        pos = m.end()
    text.append(line[pos:])
    return "".join(text), tuple(phrases)


def _read_sentences(path: Path) -> list[tuple[str, tuple[EntityPhrase, ...]]]:
    if not path.is_file():
        raise InputFileError(path, "Entities sentence file is missing", DOWNLOAD_FIX)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise InputFileError(path, f"is not UTF-8 text ({err.reason})", "re-download Flickr30k Entities") from err
    return [parse_entity_sentence(ln) for ln in lines if ln.strip()]


def _read_boxes(
    path: Path, entity_types: dict[int, tuple[str, ...]]
) -> tuple[tuple[int, int] | None, tuple[SourceObject, ...]]:
    if not path.is_file():
        raise InputFileError(path, "Entities annotation file is missing", DOWNLOAD_FIX)
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, UnicodeDecodeError) as err:
        raise InputFileError(path, f"malformed XML ({err})", "re-download Flickr30k Entities") from err
    size = None
    w, h = root.findtext("size/width"), root.findtext("size/height")
    if w and h:
        size = (int(w), int(h))
    objects = []
    for obj in root.iter("object"):
        box = obj.find("bndbox")
        if box is None:  # nobndbox / scene entities have no box
            continue
        try:
            x0, y0, x1, y1 = (float(box.findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax"))
        except (TypeError, ValueError) as err:
            raise InputFileError(
                path, f"a bndbox lacks numeric xmin/ymin/xmax/ymax ({err})", "fix or drop that object"
            ) from err
        if not all(math.isfinite(v) for v in (x0, y0, x1, y1)) or min(x0, y0) < 0 or x1 < x0 or y1 < y0:
            raise InputFileError(
                path, f"a bndbox is not a box (xmin {x0}, ymin {y0}, xmax {x1}, ymax {y1})", "fix or drop that object"
            )
        for name in obj.iter("name"):
            if not (name.text or "").strip().isdigit():
                raise InputFileError(
                    path, f"an object names entity {name.text!r}, not a number", "fix or drop that object"
                )
            entity = int(name.text)
            types = entity_types.get(entity)
            if types:
                objects.append(SourceObject(types[0], (x0, y0, x1 - x0, y1 - y0), object_id=entity))
    return size, tuple(objects)


def _entities_dir(cfg: Flickr30kSourceConfig) -> Path | None:
    if cfg.entities_dir is not None:
        if not Path(cfg.entities_dir).is_dir():
            raise InputFileError(cfg.entities_dir, "Flickr30k Entities folder is missing", DOWNLOAD_FIX)
        return Path(cfg.entities_dir)
    default = Path(cfg.root) / "flickr30k_entities"
    return default if default.is_dir() else None


def read_flickr30k(cfg: Flickr30kSourceConfig) -> list[SourceImage]:
    """Images of the selected Karpathy splits, sorted by image id, with captions (and boxes)."""
    root = Path(cfg.root)
    unknown = set(cfg.splits) - set(SPLITS)
    if unknown:
        raise InputFileError(root, f"unknown Flickr30k split(s) {sorted(unknown)}", f"choose from {', '.join(SPLITS)}")
    path = Path(cfg.karpathy_file or root / "dataset_flickr30k.json")
    data = load_json(path, "Karpathy split")
    entities = _entities_dir(cfg)
    paths = ContainedPaths(root, IMAGES_FOLDER)
    records = []
    rows: dict[int, int] = {}
    for row, entry in enumerate(data.get("images", [])):
        try:
            name, split = entry["filename"], entry["split"]
            raw = [(int(s["sentid"]), s["raw"]) for s in entry["sentences"]]
            image_id = int(Path(name).stem)
        except (KeyError, TypeError, ValueError) as err:
            raise InputFileError(
                path,
                f"image entry #{row} lacks filename/split/sentences ({err})",
                "use Karpathy's original dataset_flickr30k.json",
            ) from err
        if image_id in rows:
            raise InputFileError(
                path,
                f"image entries #{rows[image_id]} and #{row} are both image {image_id}",
                "image file names must be unique; remove one of them",
            )
        rows[image_id] = row
        if split not in cfg.splits:
            continue
        problem = paths.problem(name, f"{path.name}: image entry #{row}") or next(
            (
                InputProblem("bad_caption", f"{path.name}: sentence {sid} of image {image_id} is {text!r}, not text")
                for sid, text in raw
                if not isinstance(text, str) or not text.strip()
            ),
            None,
        )
        sentences = [(sid, text.strip() if isinstance(text, str) else "") for sid, text in raw]
        image_path = paths.base / name
        captions = tuple(SourceCaption(sid, text) for sid, text in sentences)
        objects: tuple[SourceObject, ...] = ()
        size = None
        if entities is not None:
            captions, size, objects = _entity_annotations(entities, image_id, sentences)
        if size is None:
            size = (0, 0) if problem is not None else _image_size(image_path)
        records.append(
            SourceImage(image_id, image_path, size[0], size[1], split, IMAGES_FOLDER, captions, objects, problem)
        )
    records.sort(key=lambda r: r.image_id)
    log.info("read %d Flickr30k images from %s (entities: %s)", len(records), root, entities or "none")
    return records


def _entity_annotations(
    entities: Path, image_id: int, sentences: list[tuple[int, str]]
) -> tuple[tuple[SourceCaption, ...], tuple[int, int] | None, tuple[SourceObject, ...]]:
    """An image's captions with their Entities phrase spans, and its size and boxes from the
    Entities annotation. The Entities sentences replace Karpathy's one for one, in order, so
    their counts must agree; a box's class comes from the types its captions give its entity."""
    annotated = _read_sentences(entities / "Sentences" / f"{image_id}.txt")
    if len(annotated) != len(sentences):
        raise InputFileError(
            entities / "Sentences" / f"{image_id}.txt",
            f"has {len(annotated)} sentences, Karpathy's file {len(sentences)}",
            "use matching releases of both files",
        )
    captions = tuple(
        SourceCaption(sid, text, phrases) for (sid, _), (text, phrases) in zip(sentences, annotated, strict=True)
    )
    types = {p.entity_id: p.types for c in captions for p in c.phrases}
    size, objects = _read_boxes(entities / "Annotations" / f"{image_id}.xml", types)
    return captions, size, objects


def _image_size(path: Path) -> tuple[int, int]:
    """Width and height from the image header (no decoding); (0, 0) when unreadable, so the
    builder reports the image when it opens it, with the rest of the run unaffected."""
    try:
        with Image.open(path) as img:
            return img.size
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return (0, 0)
