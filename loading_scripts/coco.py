"""Reader of an MS-COCO download: images, captions, instances and the Karpathy split.

Expected layout (what cocodataset.org and Karpathy's splits give you):

    ROOT/{train2014,val2014,train2017,...}/<file_name>.jpg
    ROOT/annotations/captions_<split>.json, instances_<split>.json
    ROOT/dataset_coco.json            (optional: Karpathy split, needed for --karpathy-split)

`read_coco(CocoSourceConfig(root))` returns cheap `SourceImage` records (`loading_scripts.records`:
paths, boxes, captions, no pixels) for builders to shard.
Every field is checked (no silent coercion): a malformed file or repeated ids fail the read with
the file and rows named; a malformed field of one image marks that record's `input_problem`.

A `file_name` must name a file inside its image folder or elsewhere inside ROOT, after `..` and
symlinks (`builders.engine.contained_paths`); one that leads outside (`../../etc/passwd`, an
absolute path elsewhere, a symlink in `val2014/` to a file outside) is never stat'ed or opened: its
record's `input_problem` is `path_outside_root`. The image folders themselves (`ROOT/val2014`) may
be symlinks, e.g. to another disk.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from builders.engine.contained_paths import ContainedPaths, is_folder_name
from builders.engine.errors import InputFileError, InputProblem
from loading_scripts.records import SourceCaption, SourceImage, SourceObject

log = logging.getLogger(__name__)

DOWNLOAD_FIX = (
    "download COCO from https://cocodataset.org/#download (and Karpathy's "
    "dataset_coco.json), or make a tiny one with `counterfactory fixture coco DIR`"
)
KARPATHY_SPLITS = ("train", "restval", "val", "test")


@dataclass
class CocoSourceConfig:
    """Which part of a COCO download to read. Example:
    `CocoSourceConfig(root=Path("coco"), karpathy_splits=("test",))`."""

    root: Path
    #: COCO folders to read (`val2014`, `train2017`, ...); default: every `captions_*.json` found.
    coco_splits: tuple[str, ...] | None = None
    #: Keep only images of these Karpathy splits (reads `karpathy_file`); default: no filtering.
    karpathy_splits: tuple[str, ...] | None = None
    #: Karpathy split file; default `ROOT/dataset_coco.json`.
    karpathy_file: Path | None = None
    #: Read `instances_*.json` (boxes); builders that only need captions turn this off.
    with_instances: bool = True


def load_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise InputFileError(path, f"{what} file is missing", DOWNLOAD_FIX)
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise InputFileError(
            path, f"is not UTF-8 text (byte {err.start})", "re-download the file; it is truncated or corrupt"
        ) from err
    except json.JSONDecodeError as err:
        raise InputFileError(
            path,
            f"malformed JSON at line {err.lineno} column {err.colno}: {err.msg}",
            "re-download the file; it is truncated or corrupt",
        ) from err
    if not isinstance(data, dict):
        raise InputFileError(path, f"holds a JSON {type(data).__name__}, not an object", f"this is not a {what} file")
    return data


def _is_number(value: object) -> bool:
    # bool is an int subclass; "12" and [1] are not numbers either (no silent coercion).
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: object) -> bool:
    return _is_number(value) and float(value).is_integer()


@dataclass
class _AnnotationFile:
    """One `captions_*.json` / `instances_*.json`, checked and indexed by image id."""

    path: Path
    images: dict[int, dict]
    #: image id -> its annotations, sorted by annotation id.
    annotations: dict[int, list[dict]]
    #: image id -> position of its entry in `images` (to name it in messages).
    positions: dict[int, int]
    categories: dict[int, str] = field(default_factory=dict)


def _unique_ids(path: Path, rows: list, what: str) -> dict[int, int]:
    """id -> row position; a missing, non-integer or repeated id fails the file, naming both rows
    (a repeated image id would give one image's annotations the other's pixels)."""
    seen: dict[int, int] = {}
    for row, entry in enumerate(rows):
        if not isinstance(entry, dict) or not _is_int(entry.get("id")):
            got = entry.get("id") if isinstance(entry, dict) else entry
            raise InputFileError(path, f"{what} #{row} has no integer 'id' (got {got!r})", "fix or drop that entry")
        key = int(entry["id"])
        if key in seen:
            first = rows[seen[key]]
            names = ""
            if what == "images":
                names = f" ({first.get('file_name')!r} and {entry.get('file_name')!r})"
            raise InputFileError(
                path,
                f"{what} #{seen[key]} and #{row} both have id {key}{names}",
                "ids must be unique; remove or renumber one of them",
            )
        seen[key] = row
    return seen


def _index(path: Path, data: dict) -> _AnnotationFile:
    for key in ("images", "annotations"):
        if not isinstance(data.get(key), list):
            raise InputFileError(path, f"has no '{key}' list", "this is not a COCO annotation file")
    positions = _unique_ids(path, data["images"], "images")
    _unique_ids(path, data["annotations"], "annotations")
    by_image: dict[int, list[dict]] = {}
    for row, ann in enumerate(data["annotations"]):
        image_id = ann.get("image_id")
        if not _is_int(image_id) or int(image_id) not in positions:
            raise InputFileError(
                path,
                f"annotation #{row} (id {ann['id']}) names image_id {image_id!r}, which is not in 'images'",
                "add the image entry or drop the annotation",
            )
        by_image.setdefault(int(image_id), []).append(ann)
    for anns in by_image.values():
        anns.sort(key=lambda a: a["id"])
    categories = {}
    for row, cat in enumerate(data.get("categories") or []):
        if not isinstance(cat, dict) or not _is_int(cat.get("id")) or not isinstance(cat.get("name"), str):
            raise InputFileError(
                path,
                f"category #{row} lacks an integer id or a name",
                "use the categories list of the original instances file",
            )
        categories[int(cat["id"])] = cat["name"]
    images = {int(e["id"]): e for e in data["images"]}
    return _AnnotationFile(path, images, by_image, positions, categories)


def _image_problem(index: _AnnotationFile, image_id: int) -> InputProblem | None:
    meta = index.images[image_id]
    where = f"{index.path.name}: images #{index.positions[image_id]} (id {image_id})"
    if not isinstance(meta.get("file_name"), str) or not meta["file_name"].strip():
        return InputProblem("bad_image_entry", f"{where} has no file_name")
    for key in ("width", "height"):
        if not _is_int(meta.get(key)) or meta[key] <= 0:
            return InputProblem("bad_image_entry", f"{where} has {key} {meta.get(key)!r}, not a positive integer")
    return None


def caption_problem(text: object, where: str) -> InputProblem | None:
    """Why `text` is not a usable caption (`bad_caption` / `blank_caption`), or None."""
    if not isinstance(text, str):
        return InputProblem("bad_caption", f"{where} is {text!r}, not a string")
    if not text.strip():
        return InputProblem("blank_caption", f"{where} is empty or whitespace")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate from a JSON \ud8xx escape
        return InputProblem("bad_caption", f"{where} is not valid Unicode ({err.reason} at character {err.start})")
    return None


def _caption(index: _AnnotationFile, ann: dict) -> SourceCaption:
    where = f"{index.path.name}: caption id {ann['id']} of image {ann['image_id']}"
    text = ann.get("caption")
    problem = caption_problem(text, where)
    return SourceCaption(int(ann["id"]), text.strip() if isinstance(text, str) else "", input_problem=problem)


def _object(index: _AnnotationFile, ann: dict) -> SourceObject | InputProblem:
    where = f"{index.path.name}: annotation id {ann['id']} of image {ann['image_id']}"
    missing = [k for k in ("category_id", "bbox", "area", "iscrowd") if k not in ann]
    if missing:
        return InputProblem("bad_annotation", f"{where} lacks {missing}")
    bbox, category_id = ann["bbox"], ann["category_id"]
    if not isinstance(bbox, list) or len(bbox) != 4 or not all(_is_number(v) for v in bbox):
        return InputProblem("bad_bbox", f"{where} has bbox {bbox!r}, not 4 finite numbers [x, y, width, height]")
    if any(v < 0 for v in bbox):
        return InputProblem("bad_bbox", f"{where} has negative numbers in bbox {bbox!r}")
    if not _is_int(category_id) or int(category_id) not in index.categories:
        return InputProblem(
            "unknown_category", f"{where} has category_id {category_id!r}, which is not in 'categories'"
        )
    if not _is_number(ann["area"]) or ann["area"] < 0:
        return InputProblem("bad_area", f"{where} has area {ann['area']!r}, not a number >= 0")
    if ann["iscrowd"] not in (0, 1) or isinstance(ann["iscrowd"], bool):
        return InputProblem("bad_annotation", f"{where} has iscrowd {ann['iscrowd']!r}, not 0 or 1")
    return SourceObject(
        index.categories[int(category_id)],
        tuple(float(v) for v in bbox),
        object_id=int(ann["id"]),
        category_id=int(category_id),
        area=float(ann["area"]),
        iscrowd=int(ann["iscrowd"]),
    )


def _karpathy(cfg: CocoSourceConfig) -> dict[int, tuple[str, str]]:
    """cocoid -> (folder, split) from Karpathy's file."""
    path = Path(cfg.karpathy_file or Path(cfg.root) / "dataset_coco.json")
    data = load_json(path, "Karpathy split")
    out: dict[int, tuple[str, str]] = {}
    rows: dict[int, int] = {}
    for row, entry in enumerate(data.get("images", [])):
        try:
            cocoid = entry["cocoid"]
            if not _is_int(cocoid):
                raise ValueError(f"cocoid {cocoid!r} is not an integer")
            value = (str(entry["filepath"]), str(entry["split"]))
        except (KeyError, TypeError, ValueError) as err:
            raise InputFileError(
                path,
                f"image entry #{row} lacks cocoid/filepath/split ({err})",
                "use Karpathy's original dataset_coco.json",
            ) from err
        if not is_folder_name(value[0]):
            # The folder names an annotation file and an image folder under the root.
            raise InputFileError(
                path,
                f"image entry #{row} has filepath {value[0]!r}, not a COCO folder name",
                "use a folder under the root, like val2014",
            )
        if int(cocoid) in out:
            raise InputFileError(
                path,
                f"image entries #{rows[int(cocoid)]} and #{row} both have cocoid {cocoid}",
                "cocoids must be unique; remove one of them",
            )
        out[int(cocoid)], rows[int(cocoid)] = value, row
    return out


def _coco_splits(cfg: CocoSourceConfig, karpathy: dict[int, tuple[str, str]] | None) -> list[str]:
    if cfg.coco_splits:
        return list(cfg.coco_splits)
    if karpathy is not None and cfg.karpathy_splits:
        return sorted({folder for folder, split in karpathy.values() if split in cfg.karpathy_splits})
    found = sorted(p.stem.removeprefix("captions_") for p in (Path(cfg.root) / "annotations").glob("captions_*.json"))
    if not found:
        raise InputFileError(Path(cfg.root) / "annotations", "holds no captions_*.json", DOWNLOAD_FIX)
    return found


def _record(
    paths: ContainedPaths,
    split: str,
    image_id: int,
    k_split: str | None,
    caps: _AnnotationFile,
    inst: _AnnotationFile | None,
) -> SourceImage:
    """One image with its annotations; its first malformed field (if any) becomes its
    `input_problem`: the whole image is skipped rather than used with a caption or box missing."""
    meta = caps.images[image_id]
    problems = [_image_problem(caps, image_id)]
    if problems[0] is None:
        problems.append(
            paths.problem(meta["file_name"], f"{caps.path.name}: images #{caps.positions[image_id]} (id {image_id})")
        )
    if inst is not None and image_id not in inst.images:
        problems.append(
            InputProblem(
                "bad_image_entry", f"{inst.path.name} has no images entry for image {image_id} of {caps.path.name}"
            )
        )
    captions = tuple(_caption(caps, a) for a in caps.annotations.get(image_id, []))
    problems += [c.input_problem for c in captions]
    objects = []
    for ann in inst.annotations.get(image_id, []) if inst is not None else []:
        obj = _object(inst, ann)
        if isinstance(obj, InputProblem):
            problems.append(obj)
        else:
            objects.append(obj)
    problem = next((p for p in problems if p is not None), None)
    valid_size = problem is None or problem.reason != "bad_image_entry"
    return SourceImage(
        image_id=image_id,
        path=paths.base / str(meta.get("file_name", "")),
        width=int(meta["width"]) if valid_size else 0,
        height=int(meta["height"]) if valid_size else 0,
        split=k_split or split,
        folder=split,
        captions=captions,
        objects=tuple(objects),
        input_problem=problem,
    )


def _read_folder(
    cfg: CocoSourceConfig, split: str, karpathy: dict[int, tuple[str, str]] | None, seen: dict[int, str]
) -> list[SourceImage]:
    """The records of one COCO folder. Its parsed files are freed on return, before the next
    folder is parsed, and the instances' polygons (most of the file, never used: records hold
    boxes) are dropped at once."""
    root = Path(cfg.root)
    cap_path = root / "annotations" / f"captions_{split}.json"
    caps = _index(cap_path, load_json(cap_path, "captions"))
    paths = ContainedPaths(root, split)
    inst = None
    if cfg.with_instances:
        inst_path = root / "annotations" / f"instances_{split}.json"
        data = load_json(inst_path, "instances")
        anns = data.get("annotations")
        for ann in anns if isinstance(anns, list) else []:  # _index names a malformed list
            if isinstance(ann, dict):
                ann.pop("segmentation", None)
        inst = _index(inst_path, data)
    records = []
    for image_id in sorted(caps.images):
        k_split = None
        if karpathy is not None:
            folder, k_split = karpathy.get(image_id, (None, None))
            if k_split not in cfg.karpathy_splits or folder != split:
                continue
        if image_id in seen:
            raise InputFileError(
                cap_path,
                f"image id {image_id} is also in captions_{seen[image_id]}.json",
                "an image id must name one image; read one of the two folders (--coco-splits)",
            )
        seen[image_id] = split
        records.append(_record(paths, split, image_id, k_split, caps, inst))
    return records


def read_coco(cfg: CocoSourceConfig) -> list[SourceImage]:
    """All images of the selected splits, sorted by image id, with captions and boxes.

    A file that cannot be trusted as a whole (malformed JSON, repeated ids, annotations of
    unknown images) raises `InputFileError`; a malformed field of one image (a caption that is
    not text, a bbox that is not 4 numbers, an unknown category, ...) sets that image's
    `input_problem`, so builders skip and count it and keep the rest.
    """
    root = Path(cfg.root)
    if cfg.karpathy_splits:
        unknown = set(cfg.karpathy_splits) - set(KARPATHY_SPLITS)
        if unknown:
            raise InputFileError(
                root, f"unknown Karpathy split(s) {sorted(unknown)}", f"choose from {', '.join(KARPATHY_SPLITS)}"
            )
    karpathy = _karpathy(cfg) if cfg.karpathy_splits else None
    records: list[SourceImage] = []
    seen: dict[int, str] = {}
    for split in _coco_splits(cfg, karpathy):
        records += _read_folder(cfg, split, karpathy, seen)
    records.sort(key=lambda r: r.image_id)
    bad = sum(r.input_problem is not None for r in records)
    log.info(
        "read %d COCO images from %s (%d with malformed annotations, skipped by builders)", len(records), root, bad
    )
    return records
