"""Training sets from our datasets: the real pairs D, the decorrelation mixture and the
COCO-Counterfactuals mixtures, exactly as the papers define them.

A training set is an index, not a copy: each example names a table, a row and an image column
(decoded later in DataLoader workers) plus its caption text, its NegCLIP negative caption and the
group it must share a batch with (`--hard-negatives pairs`).

- `none`: D, one example per (image, caption) of the Karpathy train splits of the coco-captions
  build (the paper's "train" is train + restval).
- `decorrelation --ratio R` (Kim et al. 2023 §4.4): D plus D'_sub, ceil(R x |D|) rows of D'
  drawn with `--data-seed` (all of D' without `--ratio`); more than |D'| is an error. A D' row
  (x', y') is grouped with the real example (x, y) it was made from (same image and caption id;
  one D' row per real example, later ones stay alone). Its NegCLIP negative is the original
  caption y, which names the object removed from x'.
- `cf:base|medium|all` (Le et al. 2023 §5, builders/counterfactuals/METHOD.md §5). The real part
  (a.) is, per counterfactual pair, the original caption caption_0 with its real COCO image, found
  by `source_image_id` in any split of the coco-captions build (the paper takes the real image
  of every pair, whichever Karpathy split holds it; `--real-train-splits` does not apply, and the
  leakage guard, training/leakage.py, refuses a run whose real rows include evaluation images);
  with N pairs (2N counterfactual rows):
    real   = N real, no counterfactual row (the paper's real-only baseline)
    base   = ceil(0.5 N) real + ceil(0.25 N) whole pairs (both rows)
    medium = N real + ceil(0.75 x 2N) counterfactual rows, as whole pairs plus one row of another
             pair when the count is odd (the paper's 26,115 of 34,820 rows)
    all    = N real + all 2N rows
  Then the mixture is split 80/20 by `--data-seed` over units, a unit being one pair with
  everything made from it (its real row, its counterfactual rows): floor(0.2 x units) units are
  held out, so no held-out pair's caption is trained on, as its own row or with its real image
  (the leakage guard, training/leakage.py, checks it). The held-out units are halved: the first
  floor(half) is the validation set (the validation loss, which picks the checkpoint with
  `--best-by-val-loss`, as `le2023` does), the rest holds the held-out counterfactual pairs of the
  ITM deltas (its whole pairs; for `cf:real`, which trains on no pair, the pairs of its real
  rows), so the checkpoint is never selected on the pairs that score it (`Mixture.test`: those
  examples). NegCLIP negatives: caption_1 for the real example and for image_0, caption_0 for
  image_1.
- `--counterfactuals` with `none` or `decorrelation` (or `--eval-only` without a `cf:` mix): the
  build is not trained on, so every pair of `--counterfactuals-split` is held out for the ITM
  deltas (IR_c, TR_c): a baseline or a decorrelation run is scored on a counterfactual set it
  never saw.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field

import datasets
import numpy as np

from training.config import DataConfig, SourceRef
from training.sources import DataInputError, TableRecord, column_values, open_table, resolve_commit, split_names

log = logging.getLogger(__name__)

REAL_COLUMNS = {"image": datasets.Image, "image_id": object, "caption_ids": object, "captions": object}
DPRIME_COLUMNS = {
    "image": datasets.Image,
    "image_id": object,
    "caption": object,
    "caption_id": object,
    "original_caption": object,
}
CF_COLUMNS = {"image_0": datasets.Image, "image_1": datasets.Image, "caption_0": object, "caption_1": object}
CF_FRACTIONS = {"cf:real": (1.0, 0.0), "cf:base": (0.5, 0.25), "cf:medium": (1.0, 0.75), "cf:all": (1.0, 1.0)}
VAL_FRACTION = 0.2


@dataclass
class ExampleSet:
    """Examples as parallel lists; `tables[k]` holds the image bytes of examples with table k."""

    tables: list[datasets.Dataset] = field(default_factory=list)
    table_of: list[int] = field(default_factory=list)
    row: list[int] = field(default_factory=list)
    column: list[str] = field(default_factory=list)
    caption: list[str] = field(default_factory=list)
    negative: list[str | None] = field(default_factory=list)
    #: Examples with the same group id go to the same batch (-1: alone).
    group: list[int] = field(default_factory=list)
    origin: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.row)

    def add(
        self, table: int, row: int, column: str, caption: str, negative: str | None, group: int, origin: str
    ) -> int:
        self.table_of.append(table)
        self.row.append(row)
        self.column.append(column)
        self.caption.append(caption)
        self.negative.append(negative)
        self.group.append(group)
        self.origin.append(origin)
        return len(self.row) - 1

    def subset(self, indices: list[int]) -> ExampleSet:
        out = ExampleSet(tables=self.tables)
        for i in indices:
            out.add(
                self.table_of[i],
                self.row[i],
                self.column[i],
                self.caption[i],
                self.negative[i],
                self.group[i],
                self.origin[i],
            )
        return out

    def groups(self) -> list[list[int]]:
        """Example indices per group, in first-appearance order; ungrouped examples alone."""
        out: dict[object, list[int]] = {}
        for i, g in enumerate(self.group):
            out.setdefault(("g", g) if g >= 0 else ("i", i), []).append(i)
        return list(out.values())

    def counts(self) -> dict[str, int]:
        return dict(sorted(Counter(self.origin).items()))


@dataclass
class Mixture:
    train: ExampleSet
    validation: ExampleSet | None
    #: The counterfactual pairs held out for the ITM deltas: (table, row) per pair.
    heldout_cf: list[tuple[int, int]]
    records: list[TableRecord]
    skipped: dict[str, int]
    #: A `cf:` mixture's held-out examples that are neither trained nor selected on: the half of
    #: its 20 % that holds the pairs of the ITM deltas.
    test: ExampleSet | None = None


def build_mixture(cfg: DataConfig) -> Mixture:
    """Open the sources `cfg` names and assemble the training / validation examples."""
    rng = np.random.default_rng(cfg.data_seed)
    records: list[TableRecord] = []
    skipped: Counter[str] = Counter()
    real_commit = resolve_commit(cfg.real)
    # A cf: mixture's real rows are its pairs' source images, wherever they are (module doc).
    splits = split_names(cfg.real, "default") if cfg.mix.startswith("cf:") else cfg.real_train_splits
    real_tables = [_open(cfg.real, "default", s, REAL_COLUMNS, real_commit, records) for s in splits]
    examples = ExampleSet()
    if cfg.mix.startswith("cf:"):
        return _cf_mixture(cfg, rng, examples, real_tables, records, skipped)
    real_index = _add_real(examples, real_tables)
    validation = None
    if cfg.real_val_split:
        val_table = _open(cfg.real, "default", cfg.real_val_split, REAL_COLUMNS, real_commit, records)
        validation = ExampleSet(tables=examples.tables)
        _add_real(validation, [val_table])
    if cfg.mix == "decorrelation":
        _add_decorrelation(cfg, rng, examples, real_index, records, skipped)
    heldout = (
        _add_unmixed_counterfactuals(cfg.counterfactuals, cfg.counterfactuals_split, examples, records)
        if cfg.counterfactuals
        else []
    )
    return Mixture(examples, validation, heldout, records, dict(skipped))


def eval_only_sets(cfg: DataConfig) -> Mixture:
    """What `--eval-only` scores besides the test sets: a `cf:` mixture's held-out pairs and
    validation split (they depend only on `--data-seed`, so a baseline is scored on the same ones
    as the runs it is compared with), or every pair of an unmixed `--counterfactuals`. No
    training examples."""
    if cfg.mix.startswith("cf:"):
        return build_mixture(cfg)
    return unmixed_sets(cfg.counterfactuals, cfg.counterfactuals_split)


def unmixed_sets(counterfactuals: SourceRef | None, split: str, config: str = "default") -> Mixture:
    """Every pair of the `split` of an unmixed `counterfactuals` build (its `config`: one
    generator's of a renderings dataset), held out (none without one), and no training examples:
    `--eval-only` without a `cf:` mix, and the model report."""
    examples, records = ExampleSet(), []
    heldout = (
        _add_unmixed_counterfactuals(counterfactuals, split, examples, records, config) if counterfactuals else []
    )
    return Mixture(examples, None, heldout, records, {})


def _open(ref, config, split, columns, commit, records) -> datasets.Dataset:
    ds, record = open_table(ref, config, split, columns, commit)
    records.append(record)
    return ds


def _add_real(examples: ExampleSet, tables: list[datasets.Dataset]) -> dict[tuple[int, int], int]:
    """One example per (image, caption); returns (image id, caption id) -> example index."""
    index: dict[tuple[int, int], int] = {}
    for ds in tables:
        k = len(examples.tables)
        examples.tables.append(ds)
        meta = ds.select_columns(["image_id", "caption_ids", "captions"]).to_dict()
        for row, (image_id, cap_ids, caps) in enumerate(
            zip(meta["image_id"], meta["caption_ids"], meta["captions"], strict=True)
        ):
            if len(cap_ids) != len(caps):  # our builds write them parallel; a hand-made table may not
                raise DataInputError(
                    f"--real split {ds.split}, row {row} (image {image_id}): caption_ids has "
                    f"{len(cap_ids)} ids but captions has {len(caps)} texts; give each caption its "
                    "id (or rebuild the table with `counterfactory build coco-captions`)"
                )
            for cap_id, cap in zip(cap_ids, caps, strict=True):
                index[(int(image_id), int(cap_id))] = examples.add(k, row, "image", cap, None, -1, "real")
    return index


def _add_decorrelation(cfg, rng, examples: ExampleSet, real_index, records, skipped) -> None:
    ref = cfg.decorrelation
    dprime = _open(ref, "default", "train", DPRIME_COLUMNS, resolve_commit(ref), records)
    n_real = len(examples)
    n_sub = len(dprime) if cfg.ratio is None else math.ceil(cfg.ratio * n_real)
    if n_sub > len(dprime):
        raise DataInputError(
            f"--ratio {cfg.ratio} needs ceil({cfg.ratio} x {n_real} real rows) = {n_sub} rows of D' "
            f"but {ref.path} default/train has {len(dprime)}; lower --ratio to at most "
            f"{len(dprime) / n_real:.4f} or build more D'"
        )
    chosen = np.sort(rng.permutation(len(dprime))[:n_sub])
    k = len(examples.tables)
    examples.tables.append(dprime)
    meta = dprime.select_columns(["image_id", "caption", "caption_id", "original_caption"]).to_dict()
    for row in chosen.tolist():
        partner = None
        if meta["caption_id"][row] is not None:
            partner = real_index.get((int(meta["image_id"][row]), int(meta["caption_id"][row])))
        if partner is None:
            skipped["decorrelation_pair_without_real_row"] += 1
        group = -1
        if partner is not None and examples.group[partner] < 0:
            group = partner
            examples.group[partner] = group
        examples.add(k, row, "image", meta["caption"][row], meta["original_caption"][row], group, "decorrelation")


def _add_unmixed_counterfactuals(
    ref: SourceRef, split: str, examples: ExampleSet, records, config: str = "default"
) -> list[tuple[int, int]]:
    """Every pair of the counterfactuals split as held-out (table, row), its table appended to
    `examples.tables` (no example reads it: nothing of it is trained on)."""
    cf = _open(ref, config, split, CF_COLUMNS, resolve_commit(ref), records)
    k = len(examples.tables)
    examples.tables.append(cf)
    return [(k, row) for row in range(len(cf))]


def _cf_mixture(cfg, rng, examples: ExampleSet, real_tables, records, skipped) -> Mixture:
    ref = cfg.counterfactuals
    cf = _open(ref, "default", cfg.counterfactuals_split, CF_COLUMNS, resolve_commit(ref), records)
    image_rows = _image_rows(real_tables)
    cf_columns = ["caption_0", "caption_1"] + (["source_image_id"] if "source_image_id" in cf.column_names else [])
    meta = cf.select_columns(cf_columns).to_dict()
    n_pairs = len(cf)
    n_real, n_whole, n_extra = cf_counts(n_pairs, cfg.mix)
    # The real part (a.): each pair's original caption with its real image.
    real_pairs = rng.permutation(n_pairs)[:n_real]
    order = rng.permutation(n_pairs)
    whole, extra = order[:n_whole], order[n_whole : n_whole + n_extra]
    examples.tables.extend(real_tables)
    cf_k = len(examples.tables)
    examples.tables.append(cf)
    #: Pair -> its examples (its real row and its counterfactual rows): one unit of the split,
    #: so no caption of a held-out pair is trained on, as its own row or its real image's.
    units: dict[int, list[int]] = {}
    with_real, whole_pairs = set(), set()
    image_ids = meta.get("source_image_id") or [None] * n_pairs
    for p in np.sort(real_pairs).tolist():
        image_id = image_ids[p]
        where = image_rows.get(int(image_id)) if image_id not in (None, "") else None
        if where is None:
            skipped["cf_pair_without_real_image"] += 1
            continue
        units.setdefault(p, []).append(
            examples.add(where[0], where[1], "image", meta["caption_0"][p], meta["caption_1"][p], -1, "real")
        )
        with_real.add(p)
    for p in np.sort(whole).tolist():
        a = examples.add(cf_k, p, "image_0", meta["caption_0"][p], meta["caption_1"][p], p, "counterfactual")
        b = examples.add(cf_k, p, "image_1", meta["caption_1"][p], meta["caption_0"][p], p, "counterfactual")
        units.setdefault(p, []).extend([a, b])
        whole_pairs.add(p)
    for p in extra.tolist():
        units.setdefault(p, []).append(
            examples.add(cf_k, p, "image_0", meta["caption_0"][p], meta["caption_1"][p], -1, "counterfactual")
        )
    if skipped:
        log.warning("counterfactual mixture skips: %s", dict(skipped))
    if not units:
        raise DataInputError(f"{ref.path}: the {cfg.mix} mixture is empty")
    pairs = list(units)
    shuffled = rng.permutation(len(pairs)).tolist()
    n_held = int(VAL_FRACTION * len(pairs))
    # The held-out 20 %: its first half the validation loss (it selects the checkpoint with
    # --best-by-val-loss), the rest the ITM deltas' pairs, so none is selected on.
    val_units, test_units = sorted(shuffled[: n_held // 2]), sorted(shuffled[n_held // 2 : n_held])
    train = examples.subset([i for u in sorted(shuffled[n_held:]) for i in units[pairs[u]]])
    validation = examples.subset([i for u in val_units for i in units[pairs[u]]])
    # The ITM deltas' pairs: whole pairs of that half (in cf:real, which trains on no pair, the
    # pairs of its real rows); none of their rows or captions is trained or selected on.
    scored = with_real if cfg.mix == "cf:real" else whole_pairs
    heldout = [(cf_k, pairs[u]) for u in test_units if pairs[u] in scored]
    test = examples.subset([i for u in test_units for i in units[pairs[u]]])
    return Mixture(train, validation, heldout, records, dict(skipped), test)


def cf_counts(n_pairs: int, mix: str) -> tuple[int, int, int]:
    """(real examples, whole counterfactual pairs, single counterfactual rows) of a `cf:` mix."""
    real_frac, cf_frac = CF_FRACTIONS[mix]
    if mix == "cf:medium":  # a fraction of the rows: whole pairs, plus one row if odd
        n_rows = math.ceil(cf_frac * 2 * n_pairs)
        return math.ceil(real_frac * n_pairs), n_rows // 2, n_rows % 2
    return math.ceil(real_frac * n_pairs), math.ceil(cf_frac * n_pairs), 0


def _image_rows(tables: list[datasets.Dataset]) -> dict[int, tuple[int, int]]:
    """COCO image id -> (table index, row) over the real tables."""
    out: dict[int, tuple[int, int]] = {}
    for k, ds in enumerate(tables):
        for row, image_id in enumerate(column_values(ds, "image_id")):
            out[int(image_id)] = (k, row)
    return out
