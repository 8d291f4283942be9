"""The leakage guard: what each evaluation set shares with the data the model is trained or
selected on.

Before the first step the run counts, per evaluation set, its images and captions that are also
in the training data, or in the data that picks the final model (the validation examples, with
`--best-by-val-loss`: a checkpoint chosen on an evaluation set is fitted to it). A set that
shares any refuses the run (a metric on data the model was trained or selected on says nothing
about generalisation) unless `--allow-eval-overlap`, which reports it with every metric of that
set marked in metrics.md and the model card, and the counts in run.json (`eval_overlap`).

An image is identified by what it shows, and matches by any of its keys:
- a real row, and a decorrelation D' row (an edit of that COCO image's pixels), by its COCO image
  id (`image_id`);
- a counterfactual row (synthesised from its caption pair, not from the COCO image) by its pair:
  (table, row) of the counterfactuals table;
- every image also by the sha256 of its stored bytes (no decoding): the same file under another
  id, or in another table, is the same image.

A caption matches by its text, normalised (casefolded, whitespace collapsed, trailing
punctuation dropped), and the COCO image it was written for: a real or D' row's image, a
counterfactual pair's `source_image_id` (a pair without one is free text, which matches any
image's). Equal captions of two *different* COCO images are not a leak: COCO repeats short
captions across images (the Karpathy train and test splits share hundreds), and those images are
told apart by id and bytes. Every other equal caption is: pairs made from test captions without
a `source_image_id`, or a held-out pair's caption_0 trained with its real image. A training
example's captions are its caption and, with `--hard-negatives negclip`, the negative caption it
is trained against.

The evaluation sets (training/evaluation.py) and the metrics computed on them:
- the real test split (`--real-test-split`, COCO 5K), its images and all their captions: R@K,
  the ECCV suite, the real-pair ITM deltas IR_r / TR_r;
- the ODmAP queries of the decorrelation build (COCO test images with objects removed): ODmAP@k
  and the necessity PN (which also reads the queries' original images); images only (the gallery
  holds the captions of every split, the trained ones too, by design);
- the held-out counterfactual pairs, a pair's two images as one and its two captions: the ITM
  deltas IR_c / TR_c.
The validation loss is no reported result; in the `cf:` mixtures it and the ITM deltas take the
two halves of the held-out 20 % (training/mixtures.py), so neither picks what the other scores.
"""

from __future__ import annotations

import hashlib
import logging
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from training.sources import DataInputError, column_values

if TYPE_CHECKING:  # the sweep's summary marks names without importing torch
    from training.eval_data import EvalData
    from training.mixtures import ExampleSet

log = logging.getLogger(__name__)

#: Image columns of a counterfactual pair (identified by its pair, not a COCO id).
PAIR_COLUMNS = ("image_0", "image_1")
CAPTIONS = ("caption_0", "caption_1")
#: Rows of image bytes hashed per page (memory-mapped Arrow, read without copying).
PAGE = 256
TRAINING, SELECTION = "training", "checkpoint selection"
_WHERE = {
    TRAINING: "the training data",
    SELECTION: "the checkpoint-selection data (the validation examples of --best-by-val-loss)",
}


@dataclass
class EvalSet:
    key: str
    label: str
    #: What to change instead of passing --allow-eval-overlap.
    fix: str
    #: Name prefixes of the metrics computed on this set.
    metrics: tuple[str, ...]
    #: Image identity -> every key it matches by (the identity, its bytes' digest).
    images: dict[tuple, set]
    #: (normalised caption, the COCO image it was written for or None).
    texts: set[tuple[str, object]] = field(default_factory=set)


def normalise(text: str) -> str:
    """A caption as the guard compares it: casefolded, whitespace collapsed, trailing
    punctuation dropped (`A dog on a bench.` and `a dog  on a bench` are one caption)."""
    text = " ".join(str(text).casefold().split())
    while text and unicodedata.category(text[-1]).startswith("P"):
        text = text[:-1].rstrip()
    return text


def _image_of(value) -> object:
    """A COCO image id as a key (a `source_image_id` is a string): None when there is none."""
    if value is None or value == "":
        return None
    text = str(value)
    return int(text) if text.isdigit() else text


def _identities(examples: ExampleSet) -> Iterator[tuple[int, tuple, object]]:
    """(example index, image identity, the COCO image its captions were written for)."""
    columns: dict[tuple[int, str], list | None] = {}

    def column(k: int, name: str) -> list | None:
        # The whole column once, as a list: `table[name][row]` is a `Dataset.__getitem__` per
        # row, which under datasets 5.x deep-copies the table's replay list (~1.3 ms a row).
        if (k, name) not in columns:
            table = examples.tables[k]
            columns[k, name] = column_values(table, name) if name in table.column_names else None
        return columns[k, name]

    for i, (k, row, col) in enumerate(zip(examples.table_of, examples.row, examples.column, strict=True)):
        if row < 0:
            continue
        if col in PAIR_COLUMNS:
            source = column(k, "source_image_id")
            yield i, ("pair", k, row), _image_of(source[row]) if source is not None else None
            continue
        ids = column(k, "image_id")
        if ids is None:
            yield i, ("row", k, col, row), None
        else:
            yield i, ("coco", int(ids[row])), int(ids[row])


def _digests(table, column: str, rows: set[int]) -> Iterator[tuple[int, str]]:
    """sha256 of the stored bytes of image column `column` at `rows`, a page at a time."""
    import pyarrow.compute as pc

    view = table.select_columns([column]).with_format("arrow")
    ordered = sorted(rows)
    j = 0
    while j < len(ordered):
        start = ordered[j] - ordered[j] % PAGE
        cells = pc.struct_field(view[start : start + PAGE][column], "bytes")
        while j < len(ordered) and ordered[j] < start + PAGE:
            cell = cells[ordered[j] - start]
            if cell.is_valid:
                yield ordered[j], hashlib.sha256(cell.as_buffer()).hexdigest()
            j += 1


def image_keys(examples: ExampleSet) -> dict[tuple, set]:
    """Identity -> keys (the identity and the digest of its bytes) of every image `examples`
    reads (see the module doc); a pair's two images are one identity."""
    out: dict[tuple, set] = {}
    wanted: dict[tuple[int, str], dict[int, tuple]] = {}
    for i, identity, _ in _identities(examples):
        out.setdefault(identity, {identity})
        wanted.setdefault((examples.table_of[i], examples.column[i]), {})[examples.row[i]] = identity
    for (k, col), rows in wanted.items():
        if col not in examples.tables[k].column_names:  # a table made without images (tests)
            continue
        for row, digest in _digests(examples.tables[k], col, set(rows)):
            out[rows[row]].add(("sha256", digest))
    return out


def text_keys(examples: ExampleSet, negatives: bool) -> dict[str, set]:
    """Normalised caption -> the COCO images it was trained with (None: free text) of every
    example's caption, and its negative caption with `negatives` (NegCLIP)."""
    out: dict[str, set] = {}
    for i, _, image in _identities(examples):
        for text in (examples.caption[i], examples.negative[i] if negatives else None):
            if text:
                out.setdefault(normalise(text), set()).add(image)
    return out


def pair_texts(pairs: ExampleSet) -> set[tuple[str, object]]:
    """(normalised caption, source image) of both captions of each held-out pair."""
    out = set()
    tables: dict[int, list[list]] = {}
    for _, (_, k, row), image in _identities(pairs):
        if k not in tables:
            table = pairs.tables[k]
            tables[k] = [column_values(table, c) for c in CAPTIONS if c in table.column_names]
        out |= {(normalise(texts[row]), image) for texts in tables[k] if texts[row]}
    return out


def eval_sets(data: EvalData) -> list[EvalSet]:
    """The evaluation sets of `data` with their images and captions."""
    out = []
    if data.retrieval is not None:
        out.append(
            EvalSet(
                "real_test",
                "the real test split (--real-test-split)",
                "train without them or skip the set with --real-test-split ''",
                ("zeroshot_retrieval/", "zeroshot_retrieval_1k/", "eccv/", "itm/IR_r", "itm/TR_r"),
                image_keys(data.retrieval),
                {(normalise(c), int(i)) for c, i in zip(data.captions, data.caption_image, strict=True)},
            )
        )
    if data.queries is not None:
        out.append(
            EvalSet(
                "odmap_queries",
                "the ODmAP queries of --decorrelation",
                "train on images outside its test set",
                ("odmap/", "necessity/"),
                image_keys(data.queries),
            )
        )
    if data.cf_pairs is not None:
        out.append(
            EvalSet(
                "heldout_counterfactuals",
                "the held-out counterfactual pairs",
                "train on other pairs",
                ("itm/IR_c", "itm/TR_c"),
                image_keys(data.cf_pairs),
                pair_texts(data.cf_pairs),
            )
        )
    return out


def _shared(s: EvalSet, images: set, texts: dict[str, set]) -> tuple[int, int]:
    """(images, captions) of `s` that `images` / `texts` hold (module doc: equal captions of
    two different COCO images do not count)."""
    n_images = sum(1 for keys in s.images.values() if keys & images)
    n_texts = sum(
        1
        for text, image in s.texts
        if text in texts and (image is None or None in texts[text] or image in texts[text])
    )
    return n_images, n_texts


def _merged(keyed: list[tuple[str, set, dict]]) -> tuple[set, dict[str, set]]:
    images, texts = set(), {}
    for _, i, t in keyed:
        images |= i
        for text, where in t.items():
            texts.setdefault(text, set()).update(where)
    return images, texts


def _counts(s: EvalSet, images: int, captions: int) -> str:
    """`7 of the 8 images of SET, and 35 of its 40 captions,`, or `3 of the 40 captions of SET`."""
    if not images:
        return f"{captions} of the {len(s.texts)} captions of {s.label}"
    also = f", and {captions} of its {len(s.texts)} captions," if captions else ""
    return f"{images} of the {len(s.images)} images of {s.label}{also}"


def check_eval_overlap(
    train: ExampleSet, data: EvalData, allow: bool, negatives: bool = False, selection: ExampleSet | None = None
) -> dict[str, dict]:
    """Per evaluation set sharing images or captions with `train` (its negative captions too with
    `negatives`) or with `selection` (the validation examples that pick the checkpoint):
    {key: {set, shared, images, captions_shared, captions, data, metrics}} (empty when none
    does). Raises a one-line error for the first such set unless `allow`."""
    used = [(TRAINING, train, negatives)] + ([(SELECTION, selection, False)] if selection else [])
    keyed = [(name, set().union(*image_keys(ex).values()), text_keys(ex, neg)) for name, ex, neg in used]
    overlap = {}
    for s in eval_sets(data):
        where = [name for name, i, t in keyed if any(_shared(s, i, t))]
        if not where:
            continue
        images, captions = _shared(s, *_merged(keyed))
        if not allow:
            on = " and ".join("trained" if w == TRAINING else "selected" for w in where)
            fix = s.fix + (
                "; pick the checkpoint on other data (--real-val-split) or drop --best-by-val-loss"
                if SELECTION in where
                else ""
            )
            raise DataInputError(
                f"{_counts(s, images, captions)} are in "
                f"{' and '.join(_WHERE[w] for w in where)}, so its metrics "
                f"({', '.join(p.rstrip('/') for p in s.metrics)}) would be measured on data the "
                f"model was {on} on; {fix}, or pass --allow-eval-overlap to report them marked as "
                "overlapping"
            )
        log.warning(
            "%s are in %s: its metrics are marked as overlapping (--allow-eval-overlap)",
            _counts(s, images, captions),
            " and ".join(_WHERE[w] for w in where),
        )
        overlap[s.key] = {
            "set": s.label,
            "shared": images,
            "images": len(s.images),
            "captions_shared": captions,
            "captions": len(s.texts),
            "data": where,
            "metrics": list(s.metrics),
        }
    return overlap


def overlap_mark(o: dict) -> str:
    """`[overlaps training: 7/8 images]`, `[overlaps checkpoint selection: 3/40 captions]`, ...
    (a run.json of an earlier version records images and training only)."""
    parts = [f"{o['shared']}/{o['images']} images"] if o["shared"] or not o.get("captions_shared") else []
    if o.get("captions_shared"):
        parts.append(f"{o['captions_shared']}/{o['captions']} captions")
    return f"[overlaps {' and '.join(o.get('data', [TRAINING]))}: {', '.join(parts)}]"


def mark_overlapping(metrics: dict[str, Any], overlap: dict[str, dict]) -> dict[str, Any]:
    """`metrics` with the name of every metric of an overlapping set marked (for the tables of
    metrics.md, the model card and a sweep's summary.md; run.json keeps the plain names)."""
    out = {}
    for name, value in metrics.items():
        hit = next((o for o in overlap.values() if name.startswith(tuple(o["metrics"]))), None)
        if hit is not None:
            name = f"{name} {overlap_mark(hit)}"
        out[name] = value
    return out
