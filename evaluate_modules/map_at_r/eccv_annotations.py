"""Reader of the ECCV Caption, CxC and COCO positives shipped in the `eccv_caption` package.

The PyPI package `eccv_caption` (0.1.0; Chun et al., 2022) ships, in `eccv_caption/data/`:

    eccv_{image_to_caption,caption_to_image}.json      ECCV Caption (human-verified + CxC)
    cxc_{image_to_caption,caption_to_image}.json       CrissCrossed Captions
    original_{image_to_caption,caption_to_image}.json  the original COCO pairs (5K test split)
    coco_test_ids.npy                                  the 25,000 test caption ids, in fold order

Each JSON maps a query id (as a string) to its positive ids: image -> caption ids (i2t) and
caption -> image ids (t2i). `read_positives("eccv")` returns them as `Positives`.

Plausible-match (PM) pseudo-positives, needed for PMRP, are not shipped (> 140 MB). Either read
the official `pm_*.json` files (`read_pm_positives(DIR)`) or compute them from COCO instance
annotations (`pm_positives_from_instances`), the way the PCME / ECCV Caption tooling does.

Bad files raise `AnnotationFileError` (a `ValueError`) naming the file and the fix.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

__all__ = [
    "AnnotationFileError",
    "PM_FIX",
    "Positives",
    "SOURCES",
    "coco_test_caption_ids",
    "eccv_data_dir",
    "pm_positives",
    "pm_positives_from_instances",
    "read_pm_positives",
    "read_positive_files",
    "read_positives",
]


class AnnotationFileError(ValueError):
    """An annotation file is missing or malformed: `path: problem (fix)`."""

    def __init__(self, path: object, problem: str, fix: str = "") -> None:
        self.path, self.problem, self.fix = str(path), problem, fix
        super().__init__(f"{self.path}: {problem}" + (f" ({fix})" if fix else ""))


SOURCES = ("eccv", "cxc", "coco")
#: Source name -> file prefix in the package data folder.
_PREFIX = {"eccv": "eccv", "cxc": "cxc", "coco": "original", "pm": "pm"}
PM_FIX = (
    "download the PM files as described at https://github.com/naver-ai/eccv-caption, or "
    "compute them from COCO's instances_val2014.json (coco_instances=...)"
)


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
        raise AnnotationFileError(
            "eccv_caption", "the package is not installed", "pip install eccv_caption==0.1.0"
        ) from err
    return Path(eccv_caption.__file__).resolve().parent / "data"


def read_positive_files(i2t_path: Path, t2i_path: Path) -> Positives:
    """Read an image->captions and a caption->images JSON pair (the `eccv_caption` format)."""
    return Positives(i2t=_read_mapping(Path(i2t_path)), t2i=_read_mapping(Path(t2i_path)))


def read_positives(source: str, data_dir: Path | None = None) -> Positives:
    """Positives of `source` ("eccv", "cxc" or "coco"), from the package or from `data_dir`."""
    if source not in SOURCES:
        raise AnnotationFileError(source, "unknown annotation source", f"choose from {', '.join(SOURCES)}")
    folder = Path(data_dir) if data_dir else eccv_data_dir()
    return read_positive_files(
        folder / f"{_PREFIX[source]}_image_to_caption.json", folder / f"{_PREFIX[source]}_caption_to_image.json"
    )


def read_pm_positives(directory: Path) -> Positives:
    """The official PM files `pm_image_to_caption.json` / `pm_caption_to_image.json` in `directory`."""
    folder = Path(directory)
    for name in ("pm_image_to_caption.json", "pm_caption_to_image.json"):
        if not (folder / name).is_file():
            raise AnnotationFileError(folder / name, "PM positives file is missing", PM_FIX)
    return read_positive_files(folder / "pm_image_to_caption.json", folder / "pm_caption_to_image.json")


def coco_test_caption_ids(data_dir: Path | None = None) -> np.ndarray:
    """The 25,000 COCO 5K test caption ids in the order that defines the five COCO 1K folds."""
    path = (Path(data_dir) if data_dir else eccv_data_dir()) / "coco_test_ids.npy"
    if not path.is_file():
        raise AnnotationFileError(path, "COCO test id file is missing", "reinstall eccv_caption==0.1.0")
    try:
        ids = np.load(path)
    except (OSError, ValueError) as err:
        raise AnnotationFileError(path, f"cannot read it ({err})", "reinstall eccv_caption==0.1.0") from err
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise AnnotationFileError(
            path, f"expected a flat integer array, got {ids.dtype} {ids.shape}", "reinstall eccv_caption==0.1.0"
        )
    return ids.astype(np.int64)


def _read_mapping(path: Path) -> dict[int, np.ndarray]:
    raw = _read_json(path, "positives file is missing", "reinstall eccv_caption==0.1.0 or check the folder")
    if not isinstance(raw, dict):
        raise AnnotationFileError(path, f"expected an object id -> [ids], got {type(raw).__name__}")
    out = {}
    for key, ids in raw.items():
        try:
            out[int(key)] = np.asarray([int(i) for i in ids], dtype=np.int64)
        except (TypeError, ValueError) as err:
            raise AnnotationFileError(
                path, f"entry {key!r} is not an id -> list of ids ({err})", "fix or drop that entry"
            ) from err
    return out


# ----------------------------------------------------------------------------- plausible matches


def pm_positives(
    image_classes: Mapping[int, Sequence[int]],
    image_to_captions: Mapping[int, Sequence[int]],
    zeta: int = 0,
    omit_own_image: bool = False,
) -> Positives:
    """Plausible-match positives: images whose class-presence vectors differ in <= zeta classes.

    `image_classes` maps each image (of those in `image_to_captions`, the test split) to the
    category ids of its instances; an image absent from it or with no classes is no PM query and
    no PM item, as in the reference tooling. Image i's PM captions are all captions of its PM
    images (i itself included unless `omit_own_image`); each caption of i has i's PM images.
    Queries left without positives (possible with `omit_own_image`) are dropped.
    """
    images = np.asarray([i for i in image_to_captions if len(image_classes.get(i, ())) > 0], dtype=np.int64)
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


def pm_positives_from_instances(
    instances_path: Path, image_to_captions: Mapping[int, Sequence[int]], zeta: int = 0, omit_own_image: bool = False
) -> Positives:
    """`pm_positives` with the classes read from a COCO `instances_*.json` file."""
    path = Path(instances_path)
    data = _read_json(
        path,
        "COCO instances file is missing",
        "give the path of COCO's instances_val2014.json (from annotations_trainval2014.zip)",
    )
    if not isinstance(data, dict) or not isinstance(data.get("annotations"), list):
        raise AnnotationFileError(path, "has no 'annotations' list", "pass a COCO instances_*.json file")
    wanted = set(int(i) for i in image_to_captions)
    classes: dict[int, set[int]] = {}
    for row, ann in enumerate(data["annotations"]):
        try:
            image, category = int(ann["image_id"]), int(ann["category_id"])
        except (KeyError, TypeError, ValueError) as err:
            raise AnnotationFileError(
                path,
                f"annotation #{row} lacks an integer image_id / category_id ({err})",
                "fix or drop that annotation",
            ) from err
        if image in wanted:
            classes.setdefault(image, set()).add(category)
    if not classes:
        raise AnnotationFileError(
            path,
            f"has no instance annotation for any of the {len(wanted)} images",
            "pass the instances file of the same COCO split (instances_val2014.json for the 5K test images)",
        )
    return pm_positives({i: sorted(c) for i, c in classes.items()}, image_to_captions, zeta, omit_own_image)


def _read_json(path: Path, missing: str, fix: str) -> object:
    if not path.is_file():
        raise AnnotationFileError(path, missing, fix)
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise AnnotationFileError(
            path, f"is not UTF-8 text (byte {err.start})", "the file is truncated or corrupt; re-download it"
        ) from err
    except json.JSONDecodeError as err:
        raise AnnotationFileError(
            path,
            f"malformed JSON at line {err.lineno} column {err.colno}: {err.msg}",
            "the file is truncated or corrupt; re-download it",
        ) from err
