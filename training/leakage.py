"""The leakage guard: images shared between the training data and each evaluation set.

Before the first step the run counts, per evaluation set, the images it shares with what is
trained on; a set that shares any refuses the run (a metric on images the model was trained on
says nothing about generalisation) unless `--allow-eval-overlap`, which reports it with every
metric of that set marked in metrics.md and the model card, and the counts in run.json
(`eval_overlap`).

An image is identified by what it shows:
- a real row, and a decorrelation D' row (an edit of that COCO image's pixels), by its COCO
  image id (`image_id`);
- a counterfactual row (synthesised from its caption pair, not from the COCO image) by its pair:
  (table, row) of the counterfactuals table.

The evaluation sets (training/evaluation.py) and the metrics computed on them:
- the real test split (`--real-test-split`, COCO 5K): R@K, the ECCV suite, the real-pair ITM
  deltas IR_r / TR_r;
- the ODmAP queries of the decorrelation build (COCO test images with objects removed): ODmAP@k
  and the necessity PN (which also reads the queries' original images);
- the held-out counterfactual pairs: the ITM deltas IR_c / TR_c.
The validation loss is not one: it selects the checkpoint, is no reported result, and in the
`cf:` mixtures it follows the paper's 80/20 split of the mixture.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from training.sources import DataInputError

if TYPE_CHECKING:  # the sweep's summary marks names without importing torch
    from training.evaluation import EvalData
    from training.mixtures import ExampleSet

log = logging.getLogger(__name__)

#: Image columns of a counterfactual pair (identified by its pair, not a COCO id).
PAIR_COLUMNS = ("image_0", "image_1")


@dataclass
class EvalSet:
    key: str
    label: str
    #: What to change instead of passing --allow-eval-overlap.
    fix: str
    #: Name prefixes of the metrics computed on this set.
    metrics: tuple[str, ...]
    images: set


def image_keys(examples: ExampleSet) -> set:
    """The identity of every image `examples` reads (see the module doc)."""
    ids: dict[int, list | None] = {}
    out: set = set()
    for k, row, column in zip(examples.table_of, examples.row, examples.column):
        if column in PAIR_COLUMNS:
            out.add(("pair", k, row))
            continue
        if k not in ids:
            table = examples.tables[k]
            ids[k] = table["image_id"] if "image_id" in table.column_names else None
        if ids[k] is not None and row >= 0:
            out.add(("coco", int(ids[k][row])))
    return out


def eval_sets(data: EvalData) -> list[EvalSet]:
    """The evaluation sets of `data` with their images."""
    out = []
    if data.retrieval is not None:
        out.append(EvalSet("real_test", "the real test split (--real-test-split)",
                           "train without them or skip the set with --real-test-split ''",
                           ("retrieval/", "retrieval_1k/", "eccv/", "itm/IR_r", "itm/TR_r"),
                           {("coco", int(i)) for i in data.image_ids}))
    if data.queries is not None:
        out.append(EvalSet("odmap_queries", "the ODmAP queries of --decorrelation",
                           "train on images outside its test set",
                           ("odmap/", "necessity/"), image_keys(data.queries)))
    if data.cf_pairs is not None:
        out.append(EvalSet("heldout_counterfactuals", "the held-out counterfactual pairs",
                           "train on other pairs", ("itm/IR_c", "itm/TR_c"), image_keys(data.cf_pairs)))
    return out


def check_eval_overlap(train: ExampleSet, data: EvalData, allow: bool) -> dict[str, dict]:
    """Per evaluation set sharing images with `train`: {key: {set, shared, images, metrics}}
    (empty when none does). Raises a one-line error for the first such set unless `allow`."""
    trained = image_keys(train)
    overlap = {}
    for s in eval_sets(data):
        shared = len(s.images & trained)
        if not shared:
            continue
        if not allow:
            raise DataInputError(
                f"{shared} of the {len(s.images)} images of {s.label} are in the training data, so "
                f"its metrics ({', '.join(p.rstrip('/') for p in s.metrics)}) would be measured on "
                f"trained-on images; {s.fix}, or pass --allow-eval-overlap to report them marked "
                "as overlapping")
        log.warning("%d of the %d images of %s are trained on: its metrics are marked as "
                    "overlapping (--allow-eval-overlap)", shared, len(s.images), s.label)
        overlap[s.key] = {"set": s.label, "shared": shared, "images": len(s.images),
                          "metrics": list(s.metrics)}
    return overlap


def mark_overlapping(metrics: dict[str, float], overlap: dict[str, dict]) -> dict[str, float]:
    """`metrics` with the name of every metric of an overlapping set marked (for the tables of
    metrics.md, the model card and a sweep's summary.md; run.json keeps the plain names)."""
    out = {}
    for name, value in metrics.items():
        hit = next((o for o in overlap.values() if name.startswith(tuple(o["metrics"]))), None)
        if hit is not None:
            name = f"{name} [overlaps training: {hit['shared']}/{hit['images']} images]"
        out[name] = value
    return out
