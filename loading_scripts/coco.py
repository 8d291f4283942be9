"""Reader of an MS-COCO download: images, captions, instances and the Karpathy split.

Expected layout (what cocodataset.org and Karpathy's splits give you):

    ROOT/{train2014,val2014,train2017,...}/<file_name>.jpg
    ROOT/annotations/captions_<split>.json, instances_<split>.json
    ROOT/dataset_coco.json            (optional: Karpathy split, needed for --karpathy-split)

`read_coco(CocoSourceConfig(root))` returns cheap `CocoImage` records (paths, boxes, captions, no
pixels) for builders to shard; `CocoSource` exposes the same data as a `datasets` builder class,
called directly (`CocoSource(config_name="captions", data_dir=ROOT).download_and_prepare()`).
Annotations are indexed with pycocotools; JSON is parsed here first so that a malformed file is
reported with its name and position instead of a bare traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import datasets

from builders.infra.errors import InputFileError

log = logging.getLogger(__name__)

DOWNLOAD_FIX = ("download COCO from https://cocodataset.org/#download (and Karpathy's "
                "dataset_coco.json), or make a tiny one with `counterfactory fixture coco DIR`")
KARPATHY_SPLITS = ("train", "restval", "val", "test")


@dataclass(frozen=True)
class CocoObject:
    annotation_id: int
    category: str
    category_id: int
    #: x, y, width, height in pixels (COCO convention).
    bbox: tuple[float, float, float, float]
    area: float
    iscrowd: int


@dataclass(frozen=True)
class CocoCaption:
    caption_id: int
    text: str


@dataclass(frozen=True)
class CocoImage:
    image_id: int
    path: Path
    width: int
    height: int
    #: The COCO folder (`val2014`) and, when a Karpathy file was read, its split (`test`).
    coco_split: str
    karpathy_split: str | None
    captions: tuple[CocoCaption, ...]
    objects: tuple[CocoObject, ...] = ()


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
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise InputFileError(path, f"malformed JSON at line {err.lineno} column {err.colno}: "
                             f"{err.msg}", "re-download the file; it is truncated or corrupt") from err


def _index(path: Path, data: dict, need: tuple[str, ...]):
    from pycocotools.coco import COCO

    for key in ("images", "annotations"):
        if not isinstance(data.get(key), list):
            raise InputFileError(path, f"has no '{key}' list", "this is not a COCO annotation file")
    for row, ann in enumerate(data["annotations"]):
        missing = [k for k in need if k not in ann]
        if missing:
            raise InputFileError(path, f"annotation #{row} (id {ann.get('id')}) lacks {missing}",
                                 "fix or drop that annotation")
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress to stdout
        coco.createIndex()
    return coco


def _karpathy(cfg: CocoSourceConfig) -> dict[int, tuple[str, str]]:
    """cocoid -> (folder, split) from Karpathy's file."""
    path = Path(cfg.karpathy_file or Path(cfg.root) / "dataset_coco.json")
    data = load_json(path, "Karpathy split")
    out = {}
    for row, entry in enumerate(data.get("images", [])):
        try:
            out[int(entry["cocoid"])] = (entry["filepath"], entry["split"])
        except (KeyError, TypeError, ValueError) as err:
            raise InputFileError(path, f"image entry #{row} lacks cocoid/filepath/split ({err})",
                                 "use Karpathy's original dataset_coco.json") from err
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


def read_coco(cfg: CocoSourceConfig) -> list[CocoImage]:
    """All images of the selected splits, sorted by image id, with captions and boxes."""
    root = Path(cfg.root)
    if cfg.karpathy_splits:
        unknown = set(cfg.karpathy_splits) - set(KARPATHY_SPLITS)
        if unknown:
            raise InputFileError(root, f"unknown Karpathy split(s) {sorted(unknown)}",
                                 f"choose from {', '.join(KARPATHY_SPLITS)}")
    karpathy = _karpathy(cfg) if cfg.karpathy_splits else None
    records: list[CocoImage] = []
    for split in _coco_splits(cfg, karpathy):
        cap_path = root / "annotations" / f"captions_{split}.json"
        caps = _index(cap_path, load_json(cap_path, "captions"), ("id", "image_id", "caption"))
        inst = None
        if cfg.with_instances:
            inst_path = root / "annotations" / f"instances_{split}.json"
            inst = _index(inst_path, load_json(inst_path, "instances"),
                          ("id", "image_id", "category_id", "bbox", "area", "iscrowd"))
        for image_id in sorted(caps.imgs):
            k_split = None
            if karpathy is not None:
                folder, k_split = karpathy.get(image_id, (None, None))
                if k_split not in cfg.karpathy_splits or folder != split:
                    continue
            meta = caps.imgs[image_id]
            captions = tuple(CocoCaption(int(a["id"]), str(a["caption"]).strip())
                             for a in sorted(caps.imgToAnns.get(image_id, []), key=lambda a: a["id"]))
            objects: tuple[CocoObject, ...] = ()
            if inst is not None:
                objects = tuple(
                    CocoObject(int(a["id"]), inst.cats[a["category_id"]]["name"], int(a["category_id"]),
                               tuple(float(v) for v in a["bbox"]), float(a["area"]), int(a["iscrowd"]))
                    for a in sorted(inst.imgToAnns.get(image_id, []), key=lambda a: a["id"]))
            records.append(CocoImage(image_id=int(image_id), path=root / split / meta["file_name"],
                                     width=int(meta["width"]), height=int(meta["height"]),
                                     coco_split=split, karpathy_split=k_split,
                                     captions=captions, objects=objects))
    records.sort(key=lambda r: r.image_id)
    log.info("read %d COCO images from %s", len(records), root)
    return records


# ----------------------------------------------------------------------------- datasets builder

_OBJECTS = datasets.List({
    "category": datasets.Value("string"), "category_id": datasets.Value("int32"),
    "bbox": datasets.Sequence(datasets.Value("float32"), length=4),
    "area": datasets.Value("float32"), "iscrowd": datasets.Value("int8"),
})
FEATURES = {
    "captions": datasets.Features({
        "image": datasets.Image(), "image_id": datasets.Value("int64"),
        "caption_id": datasets.Value("int64"), "caption": datasets.Value("string"),
    }),
    "instances": datasets.Features({
        "image": datasets.Image(), "image_id": datasets.Value("int64"),
        "width": datasets.Value("int32"), "height": datasets.Value("int32"),
        "captions": datasets.List(datasets.Value("string")), "objects": _OBJECTS,
    }),
}


@dataclass
class CocoSourceBuilderConfig(datasets.BuilderConfig):
    """`name` is `captions` (a row per caption) or `instances` (a row per image, with boxes)."""

    karpathy_splits: tuple[str, ...] | None = None
    coco_splits: tuple[str, ...] | None = None
    extra: dict = field(default_factory=dict)


class CocoSource(datasets.GeneratorBasedBuilder):
    """COCO as a `datasets` builder, called directly (never as a Hub loading script)."""

    BUILDER_CONFIG_CLASS = CocoSourceBuilderConfig
    BUILDER_CONFIGS = [CocoSourceBuilderConfig(name=n) for n in FEATURES]
    DEFAULT_CONFIG_NAME = "captions"

    def _info(self) -> datasets.DatasetInfo:
        return datasets.DatasetInfo(description="MS-COCO images, captions and boxes",
                                    features=FEATURES[self.config.name],
                                    homepage="https://cocodataset.org")

    def _split_generators(self, dl_manager):
        if not self.config.data_dir:
            raise InputFileError("data_dir", "CocoSource needs data_dir=<COCO root>", DOWNLOAD_FIX)
        root = Path(self.config.data_dir)
        if self.config.karpathy_splits:
            groups = {s: CocoSourceConfig(root, karpathy_splits=(s,),
                                          with_instances=self.config.name == "instances")
                      for s in self.config.karpathy_splits}
        else:
            splits = self.config.coco_splits or _coco_splits(CocoSourceConfig(root), None)
            groups = {s: CocoSourceConfig(root, coco_splits=(s,),
                                          with_instances=self.config.name == "instances")
                      for s in splits}
        return [datasets.SplitGenerator(name=name, gen_kwargs={"source": cfg})
                for name, cfg in groups.items()]

    def _generate_examples(self, source: CocoSourceConfig):
        for rec in read_coco(source):
            if self.config.name == "captions":
                for cap in rec.captions:
                    yield cap.caption_id, {"image": str(rec.path), "image_id": rec.image_id,
                                           "caption_id": cap.caption_id, "caption": cap.text}
            else:
                yield rec.image_id, {
                    "image": str(rec.path), "image_id": rec.image_id, "width": rec.width,
                    "height": rec.height, "captions": [c.text for c in rec.captions],
                    "objects": [{"category": o.category, "category_id": o.category_id,
                                 "bbox": list(o.bbox), "area": o.area, "iscrowd": o.iscrowd}
                                for o in rec.objects]}
