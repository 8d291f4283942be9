"""The data evaluation reads, opened once before training: `EvalData` and its loaders.

- the real test split's images and captions (`--real-test-split`), kept to the 5 standard captions
  per image on the COCO 5K test images, with its COCO 1K folds, and the `--eccv` / `--coco-instances`
  checks and annotations (what each set is for: training/evaluation.py's docstring);
- the decorrelation build's ODmAP queries and gallery; the held-out counterfactual pairs;
- the `--zeroshot` sets (loaded by training/zeroshot.py) and the `--flickr30k` retrieval set.

Its own module so that evaluation (which scores it) and zero-shot (whose sets it holds) never
import each other (tests/house/test_no_import_cycles.py).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np

from builders.engine.errors import InputFileError
from loading_scripts.flickr30k import Flickr30kSourceConfig, read_flickr30k
from training.eval_config import EvalConfig
from training.mixtures import ExampleSet, REAL_COLUMNS
from training.sources import DataInputError, TableRecord, open_table, resolve_commit
from training.zeroshot import load_zeroshot_set

log = logging.getLogger(__name__)

QUERY_COLUMNS = {
    "image": datasets.Image,
    "image_id": object,
    "removed_classes": object,
    "present_classes": object,
    "caption_ids": object,
}
GALLERY_COLUMNS = {"caption_id": object, "caption": object, "mentioned_classes": object}
FOLD = 1000


@dataclass
class EvalData:
    """Everything evaluation reads, opened once."""

    retrieval: ExampleSet | None = None  # one example per test image (caption = its first)
    image_ids: np.ndarray | None = None
    caption_ids: np.ndarray | None = None
    captions: list[str] = field(default_factory=list)
    caption_image: np.ndarray | None = None  # image id of each caption
    folds: list[np.ndarray] = field(default_factory=list)  # rows of image_ids per COCO 1K fold
    queries: ExampleSet | None = None  # odmap queries (x')
    query_image_ids: np.ndarray | None = None  # COCO id of each query's source image x
    pm_positives: object = None  # PMRP's plausible matches (--coco-instances), map_at_r Positives
    removed: list[list[str]] = field(default_factory=list)
    present: list[list[str]] = field(default_factory=list)
    query_captions: list[list[int]] = field(default_factory=list)
    gallery_captions: list[str] = field(default_factory=list)
    gallery_ids: np.ndarray | None = None
    gallery_mentions: list[list[str]] = field(default_factory=list)
    cf_pairs: ExampleSet | None = None  # held-out pairs as rows (image_0, image_1) alternating
    validation: ExampleSet | None = None
    records: list = field(default_factory=list)
    zeroshot: list = field(default_factory=list)  # training.zeroshot.ZeroShotSet per --zeroshot
    flickr30k: EvalData | None = None  # its retrieval images and captions (--flickr30k)


def load_eval_data(d: EvalConfig, heldout_cf, cf_tables, validation) -> EvalData:
    out = EvalData(validation=validation)
    if d.real is not None and d.real_test_split:
        test, record = open_table(d.real, "default", d.real_test_split, REAL_COLUMNS, resolve_commit(d.real))
        out.records.append(record)
        meta = test.select_columns(["image_id", "caption_ids", "captions"]).to_dict()
        out.retrieval = ExampleSet(tables=[test])
        for row, (caps) in enumerate(meta["captions"]):
            out.retrieval.add(0, row, "image", caps[0] if caps else "", None, -1, "real")
        out.image_ids = np.asarray(meta["image_id"], dtype=np.int64)
        out.caption_ids = np.asarray([c for ids in meta["caption_ids"] for c in ids], dtype=np.int64)
        out.captions = [c for caps in meta["captions"] for c in caps]
        out.caption_image = np.repeat(out.image_ids, [len(c) for c in meta["caption_ids"]])
        keep_standard_coco_captions(out)
        out.folds = retrieval_folds(out.image_ids)
        if d.eccv:
            check_eccv_split(out, f"{d.real.path} split {d.real_test_split!r}")
            if d.coco_instances:
                out.pm_positives = read_pm_positives(d.coco_instances)
    if d.decorrelation is not None:
        commit = resolve_commit(d.decorrelation)
        queries, rq = open_table(d.decorrelation, "odmap_queries", "test", QUERY_COLUMNS, commit)
        gallery, rg = open_table(d.decorrelation, "odmap_gallery", "test", GALLERY_COLUMNS, commit)
        out.records += [rq, rg]
        qm = queries.select_columns(["image_id", "removed_classes", "present_classes", "caption_ids"]).to_dict()
        out.query_image_ids = np.asarray(qm["image_id"], dtype=np.int64)
        out.queries = ExampleSet(tables=[queries])
        for row in range(len(queries)):
            out.queries.add(0, row, "image", "", None, -1, "decorrelation")
        out.removed, out.present, out.query_captions = qm["removed_classes"], qm["present_classes"], qm["caption_ids"]
        gm = gallery.select_columns(["caption_id", "caption", "mentioned_classes"]).to_dict()
        out.gallery_captions, out.gallery_mentions = gm["caption"], gm["mentioned_classes"]
        out.gallery_ids = np.asarray(gm["caption_id"], dtype=np.int64)
    if heldout_cf:
        out.cf_pairs = ExampleSet(tables=cf_tables)
        for table, row in heldout_cf:
            out.cf_pairs.add(table, row, "image_0", "", None, -1, "counterfactual")
            out.cf_pairs.add(table, row, "image_1", "", None, -1, "counterfactual")
    out.zeroshot = [load_zeroshot_set(spec, d.max_image_pixels) for spec in d.zeroshot]
    out.records += [z.record for z in out.zeroshot]
    if d.flickr30k:
        out.flickr30k = load_flickr30k(d.flickr30k, d.flickr30k_split)
        out.records += out.flickr30k.records
    return out


@functools.cache
def coco_5k_reference() -> tuple[np.ndarray, np.ndarray]:
    """The 25,000 COCO 5K test caption ids in eccv_caption's `coco_test_ids.npy` order (which
    defines the COCO 1K folds) and the image id owning each: (owners, captions). Read once per
    process: the protocol checks, the folds and the --eccv check all ask for it (callers must
    not modify the arrays)."""
    from counterfactory_metrics.map_at_r.eccv_annotations import coco_test_caption_ids, read_positives

    coco = read_positives("coco")
    captions = coco_test_caption_ids()
    owners = np.fromiter((coco.t2i[int(c)][0] for c in captions), dtype=np.int64, count=len(captions))
    return owners, captions


def is_coco_5k(image_ids: np.ndarray) -> bool:
    """Whether the split's images are exactly the COCO 5K test images."""
    return len(image_ids) == 5 * FOLD and set(image_ids.tolist()) == set(coco_5k_reference()[0].tolist())


def keep_standard_coco_captions(data: EvalData) -> None:
    """On the COCO 5K test images, the 5-captions-per-image protocol: COCO has a sixth or
    seventh caption for a few test images, which the published 5K/1K numbers (and the ECCV
    suite) leave out. Other splits keep every caption."""
    if not is_coco_5k(data.image_ids):
        return
    keep = np.flatnonzero(np.isin(data.caption_ids, coco_5k_reference()[1]))
    data.caption_ids, data.caption_image = data.caption_ids[keep], data.caption_image[keep]
    if data.captions:
        data.captions = [data.captions[k] for k in keep]


def retrieval_folds(image_ids: np.ndarray) -> list[np.ndarray]:
    """Rows of `image_ids` in each COCO 1K fold (sorted, so ties rank as in the whole split);
    none for splits of fewer than 5,000 images."""
    if len(image_ids) < 5 * FOLD:
        return []
    if is_coco_5k(image_ids):
        owners, _ = coco_5k_reference()
        row = {int(i): r for r, i in enumerate(image_ids)}
        per_fold = len(owners) // 5
        fold_images = [dict.fromkeys(owners[f * per_fold : (f + 1) * per_fold].tolist()) for f in range(5)]
        return [np.sort([row[i] for i in images]) for images in fold_images]
    return [np.arange(f * FOLD, (f + 1) * FOLD) for f in range(5)]


def check_eccv_split(data: EvalData, where: str) -> None:
    """`--eccv` scores against eccv_caption's annotations of the COCO 5K test split: any other
    image set cannot be scored, so it is refused before training rather than after."""
    owners, captions = coco_5k_reference()
    images = set(owners.tolist())
    outside = sorted(set(data.image_ids.tolist()) - images)
    missing_images = images - set(data.image_ids.tolist())
    missing_captions = np.setdiff1d(captions, data.caption_ids)
    if outside or missing_images or len(missing_captions):
        raise DataInputError(
            f"--eccv needs the COCO 5K test split (Karpathy test: {len(images)} images, "
            f"{len(captions)} captions) as --real-test-split, but {where} has "
            f"{len(data.image_ids)} images ({len(outside)} outside it, e.g. {outside[:3]}; "
            f"{len(missing_images)} of its images and {len(missing_captions)} of its captions "
            "missing); pass a coco-captions build with the Karpathy test split or drop --eccv"
        )


def read_pm_positives(instances: str):
    """PMRP's plausible-match positives of the COCO 5K test images (zeta = 0, as in the paper)
    from COCO's `instances_val2014.json`: read once, before training, so a wrong path fails
    first."""
    from counterfactory_metrics.map_at_r.eccv_annotations import (
        AnnotationFileError,
        pm_positives_from_instances,
        read_positives,
    )

    try:
        return pm_positives_from_instances(Path(instances), read_positives("coco").i2t)
    except AnnotationFileError as err:
        raise DataInputError(f"--coco-instances: {err}") from None


def load_flickr30k(root: str, split: str) -> EvalData:
    """The Flickr30k retrieval set as an `EvalData` with `retrieval` images and all their
    captions; images or captions the reader marks unusable are counted and skipped."""
    try:
        images = read_flickr30k(Flickr30kSourceConfig(Path(root), splits=(split,)))
    except InputFileError as err:
        raise DataInputError(f"--flickr30k {root}: {err}") from None
    usable = [im for im in images if im.input_problem is None and any(c.input_problem is None for c in im.captions)]
    if len(usable) < len(images):
        log.warning(
            "--flickr30k %s: skipped %d of %d %s images (unreadable or without captions)",
            root,
            len(images) - len(usable),
            len(images),
            split,
        )
    if not usable:
        raise DataInputError(
            f"--flickr30k {root}: no usable images in split {split!r}; give a "
            "Flickr30k folder (flickr30k-images/ + dataset_flickr30k.json)"
        )
    table = datasets.Dataset.from_dict(
        {"image": [{"bytes": im.path.read_bytes(), "path": None} for im in usable]},
        features=datasets.Features({"image": datasets.Image(decode=False)}),
    )
    out = EvalData(retrieval=ExampleSet(tables=[table]))
    captions = [[c for c in im.captions if c.input_problem is None] for im in usable]
    for row, caps in enumerate(captions):
        out.retrieval.add(0, row, "image", caps[0].text, None, -1, "flickr30k")
    out.image_ids = np.asarray([im.image_id for im in usable], dtype=np.int64)
    out.caption_ids = np.asarray([c.caption_id for caps in captions for c in caps], dtype=np.int64)
    out.captions = [c.text for caps in captions for c in caps]
    out.caption_image = np.repeat(out.image_ids, [len(caps) for caps in captions])
    out.records.append(TableRecord(root, None, None, "flickr30k", split, len(usable)))
    log.info("Flickr30k %s: %d images, %d captions", split, len(usable), len(out.captions))
    return out
