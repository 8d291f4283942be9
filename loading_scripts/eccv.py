"""Reader of the ECCV Caption, CxC and COCO positives shipped in the `eccv_caption` package.

The PyPI package `eccv_caption` (0.1.0) ships, in `eccv_caption/data/`:

    eccv_{image_to_caption,caption_to_image}.json      ECCV Caption (human-verified + CxC)
    cxc_{image_to_caption,caption_to_image}.json       CrissCrossed Captions
    original_{image_to_caption,caption_to_image}.json  the original COCO pairs (5K test split)
    coco_test_ids.npy                                  the 25,000 test caption ids, in fold order

Each JSON maps a query id (as a string) to its positive ids: image -> caption ids (i2t) and
caption -> image ids (t2i). `read_positives("eccv")` returns them as `Positives`;
`EccvPositivesSource` exposes the same rows as a `datasets` builder class, called directly
(`EccvPositivesSource(config_name="cxc").download_and_prepare(); .as_dataset("t2i")`).

Plausible-match (PM) pseudo-positives, needed for PMRP, are not shipped (> 140 MB). Either read
the official `pm_*.json` files (`read_pm_positives(DIR)`) or compute them from COCO instance
annotations (`pm_positives_from_instances`), the way the PCME / ECCV Caption tooling does.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np

from builders.infra.errors import InputFileError

log = logging.getLogger(__name__)

SOURCES = ("eccv", "cxc", "coco")
#: Source name -> file prefix in the package data folder.
_PREFIX = {"eccv": "eccv", "cxc": "cxc", "coco": "original", "pm": "pm"}
PM_FIX = ("download the PM files as described at https://github.com/naver-ai/eccv-caption, or "
          "compute them with loading_scripts.eccv.pm_positives_from_instances(instances_val2014.json)")


@dataclass(frozen=True)
class Positives:
    """Ground-truth positives of one annotation source, in file order.

    `i2t`: image id -> caption ids; `t2i`: caption id -> image ids (int64 arrays).
    """

    i2t: dict[int, np.ndarray] = field(repr=False)
    t2i: dict[int, np.ndarray] = field(repr=False)

    def __repr__(self) -> str:
        return f"Positives({len(self.i2t)} image queries, {len(self.t2i)} caption queries)"


def eccv_data_dir() -> Path:
    """The data folder of the installed `eccv_caption` package."""
    try:
        with warnings.catch_warnings():
            # Its __init__ warns that the optional `ujson` is missing; we only need its data.
            warnings.simplefilter("ignore", UserWarning)
            import eccv_caption
    except ImportError as err:
        raise InputFileError("eccv_caption", "the package is not installed",
                             "pip install eccv_caption==0.1.0") from err
    return Path(eccv_caption.__file__).resolve().parent / "data"


def read_positive_files(i2t_path: Path, t2i_path: Path) -> Positives:
    """Read an image->captions and a caption->images JSON pair (the `eccv_caption` format)."""
    return Positives(i2t=_read_mapping(Path(i2t_path)), t2i=_read_mapping(Path(t2i_path)))


def read_positives(source: str, data_dir: Path | None = None) -> Positives:
    """Positives of `source` ("eccv", "cxc" or "coco"), from the package or from `data_dir`."""
    if source not in SOURCES:
        raise InputFileError(source, "unknown annotation source", f"choose from {', '.join(SOURCES)}")
    folder = Path(data_dir) if data_dir else eccv_data_dir()
    return read_positive_files(folder / f"{_PREFIX[source]}_image_to_caption.json",
                               folder / f"{_PREFIX[source]}_caption_to_image.json")


def read_pm_positives(directory: Path) -> Positives:
    """The official PM files `pm_image_to_caption.json` / `pm_caption_to_image.json` in `directory`."""
    folder = Path(directory)
    for name in ("pm_image_to_caption.json", "pm_caption_to_image.json"):
        if not (folder / name).is_file():
            raise InputFileError(folder / name, "PM positives file is missing", PM_FIX)
    return read_positive_files(folder / "pm_image_to_caption.json",
                               folder / "pm_caption_to_image.json")


def coco_test_caption_ids(data_dir: Path | None = None) -> np.ndarray:
    """The 25,000 COCO 5K test caption ids in the order that defines the five COCO 1K folds."""
    path = (Path(data_dir) if data_dir else eccv_data_dir()) / "coco_test_ids.npy"
    if not path.is_file():
        raise InputFileError(path, "COCO test id file is missing", "reinstall eccv_caption==0.1.0")
    try:
        ids = np.load(path)
    except (OSError, ValueError) as err:
        raise InputFileError(path, f"cannot read it ({err})", "reinstall eccv_caption==0.1.0") from err
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise InputFileError(path, f"expected a flat integer array, got {ids.dtype} {ids.shape}",
                             "reinstall eccv_caption==0.1.0")
    return ids.astype(np.int64)


def _read_mapping(path: Path) -> dict[int, np.ndarray]:
    if not path.is_file():
        raise InputFileError(path, "positives file is missing", "reinstall eccv_caption==0.1.0 or "
                             "check the folder")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise InputFileError(path, f"malformed JSON at line {err.lineno} column {err.colno}: "
                             f"{err.msg}", "the file is truncated or corrupt; re-download it") from err
    if not isinstance(raw, dict):
        raise InputFileError(path, f"expected an object id -> [ids], got {type(raw).__name__}")
    out = {}
    for key, ids in raw.items():
        try:
            out[int(key)] = np.asarray([int(i) for i in ids], dtype=np.int64)
        except (TypeError, ValueError) as err:
            raise InputFileError(path, f"entry {key!r} is not an id -> list of ids ({err})",
                                 "fix or drop that entry") from err
    return out


# ----------------------------------------------------------------------------- plausible matches

def pm_positives(image_classes: Mapping[int, Sequence[int]],
                 image_to_captions: Mapping[int, Sequence[int]], zeta: int = 0,
                 omit_own_image: bool = False) -> Positives:
    """Plausible-match positives: images whose class-presence vectors differ in <= zeta classes.

    `image_classes` maps each image (of those in `image_to_captions`, the test split) to the
    category ids of its instances; an image absent from it or with no classes is no PM query and
    no PM item, as in the reference tooling. Image i's PM captions are all captions of its PM
    images (i itself included unless `omit_own_image`); each caption of i has i's PM images.
    Queries left without positives (possible with `omit_own_image`) are dropped.
    """
    images = np.asarray([i for i in image_to_captions if len(image_classes.get(i, ())) > 0],
                        dtype=np.int64)
    categories = sorted({int(c) for i in images for c in image_classes[int(i)]})
    column = {c: j for j, c in enumerate(categories)}
    codes = np.zeros((len(images), len(categories)), dtype=np.float32)
    for row, image in enumerate(images):
        codes[row, [column[int(c)] for c in image_classes[int(image)]]] = 1.0
    # Hamming distance of binary vectors: |a| + |b| - 2 a.b (exact in float32 below 2**24).
    sizes = codes.sum(axis=1)
    distance = sizes[:, None] + sizes[None, :] - 2.0 * (codes @ codes.T)
    match = distance <= zeta
    if omit_own_image:
        np.fill_diagonal(match, False)
    captions = [np.asarray(image_to_captions[int(i)], dtype=np.int64) for i in images]
    i2t: dict[int, np.ndarray] = {}
    t2i: dict[int, np.ndarray] = {}
    for row, image in enumerate(images):
        pm_rows = np.flatnonzero(match[row])
        if len(pm_rows) == 0:
            continue
        i2t[int(image)] = np.unique(np.concatenate([captions[j] for j in pm_rows]))
        pm_images = np.sort(images[pm_rows])
        for caption in captions[row]:
            t2i[int(caption)] = pm_images
    log.info("PM positives (zeta=%d): %d image queries, %d caption queries", zeta, len(i2t), len(t2i))
    return Positives(i2t=i2t, t2i=t2i)


def pm_positives_from_instances(instances_path: Path, image_to_captions: Mapping[int, Sequence[int]],
                                zeta: int = 0, omit_own_image: bool = False) -> Positives:
    """`pm_positives` with the classes read from a COCO `instances_*.json` file."""
    from loading_scripts.coco import load_json

    path = Path(instances_path)
    data = load_json(path, "COCO instances")
    if not isinstance(data.get("annotations"), list):
        raise InputFileError(path, "has no 'annotations' list", "pass a COCO instances_*.json file")
    wanted = set(int(i) for i in image_to_captions)
    classes: dict[int, set[int]] = {}
    for row, ann in enumerate(data["annotations"]):
        try:
            image, category = int(ann["image_id"]), int(ann["category_id"])
        except (KeyError, TypeError, ValueError) as err:
            raise InputFileError(path, f"annotation #{row} lacks an integer image_id / "
                                 f"category_id ({err})", "fix or drop that annotation") from err
        if image in wanted:
            classes.setdefault(image, set()).add(category)
    if not classes:
        raise InputFileError(path, "has no instance annotation for any of the "
                             f"{len(wanted)} images", "pass the instances file of the same COCO "
                             "split (instances_val2014.json for the 5K test images)")
    return pm_positives({i: sorted(c) for i, c in classes.items()}, image_to_captions, zeta,
                        omit_own_image)


# ----------------------------------------------------------------------------- datasets builder

@dataclass
class EccvPositivesConfig(datasets.BuilderConfig):
    """`name` is a source (eccv, cxc, coco) or `pm` (then `data_dir` holds the pm_*.json files);
    `data_dir` defaults to the installed package's data folder for the shipped sources."""


class EccvPositivesSource(datasets.GeneratorBasedBuilder):
    """Positives as rows (query_id, positive_ids) in splits `i2t` and `t2i`; called directly."""

    BUILDER_CONFIG_CLASS = EccvPositivesConfig
    BUILDER_CONFIGS = [EccvPositivesConfig(name=n) for n in (*SOURCES, "pm")]
    DEFAULT_CONFIG_NAME = "eccv"

    def _info(self) -> datasets.DatasetInfo:
        return datasets.DatasetInfo(
            description="Image-to-caption and caption-to-image positives of the COCO 5K test split",
            features=datasets.Features({"query_id": datasets.Value("int64"),
                                        "positive_ids": datasets.List(datasets.Value("int64"))}),
            homepage="https://github.com/naver-ai/eccv-caption")

    def _split_generators(self, dl_manager):
        if self.config.name == "pm":
            if not self.config.data_dir:
                raise InputFileError("data_dir", "the pm config needs data_dir=<folder with "
                                     "pm_*.json>", PM_FIX)
            positives = read_pm_positives(Path(self.config.data_dir))
        else:
            positives = read_positives(self.config.name, self.config.data_dir)
        return [datasets.SplitGenerator(name=name, gen_kwargs={"mapping": mapping})
                for name, mapping in (("i2t", positives.i2t), ("t2i", positives.t2i))]

    def _generate_examples(self, mapping: dict[int, np.ndarray]):
        for query_id, ids in mapping.items():
            yield query_id, {"query_id": query_id, "positive_ids": ids.tolist()}
