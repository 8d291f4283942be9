"""The datasets a benchmark scores, each opened once (for every model) by the trainer's
evaluation loaders, so the numbers are those `--eval-only` reports for the same build."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow.parquet as pq

from builders.engine.dataset_source import local_data_files
from builders.engine.errors import InputFileError
from builders.engine.provenance import model_name
from training.config import SourceRef
from training.eval_config import EvalConfig
from training.eval_data import EvalData, is_coco_5k, load_eval_data, read_pm_positives
from training.evaluation import UndecodableImage
from training.mixtures import unmixed_sets
from training.sources import DataInputError

log = logging.getLogger(__name__)

#: dataset name (and flag) -> the EvalConfig field that reads it.
KINDS = {"coco": "real", "decorrelation": "decorrelation", "counterfactuals": "counterfactuals"}


@dataclass
class BenchmarkDataset:
    #: coco, decorrelation or counterfactuals; `counterfactuals/G` for generator G's config of a
    #: renderings dataset (its records' `dataset`: the report, the Hub results and the paired
    #: comparisons treat each generator's pairs as a dataset of their own).
    name: str
    source: SourceRef
    cfg: EvalConfig  # how it is scored: as `--eval-only` scores it
    data: EvalData
    tables: list = field(default_factory=list)  # TableRecord of every table read
    #: The generator (config) of a renderings dataset's; None for any other build.
    generator: str | None = None
    #: A renderings config's pair ids, in the order of its pairs' units (the ITM deltas').
    pair_ids: list[str] | None = None

    @property
    def kind(self) -> str:
        """The flag it was given with (KINDS)."""
        return self.name.partition("/")[0]

    @property
    def config(self) -> str:
        return self.generator or "default"

    def provenance(self) -> dict:
        """Where the numbers come from: the repo/folder (local folders named by content), the
        revision asked for and the commit it resolved to (and the generator of a renderings
        config)."""
        first = self.tables[0]
        # A local build by its name and content digest (local:NAME@sha256:...), never by a path
        # of this machine: the records are shared (results.jsonl, --push-to-hub).
        source = model_name(first.path) if first.commit is None else first.path
        out = {"dataset_source": source, "dataset_revision": first.revision, "dataset_commit": first.commit}
        return {**out, "generator": self.generator} if self.generator else out


def locate(ds: BenchmarkDataset, err: UndecodableImage) -> DataInputError:
    """`err` as one line naming the flag, the shard file (of a local build) and its row there."""
    config, split = {
        "decorrelation": ("odmap_queries", "test"),
        "counterfactual": (ds.config, ds.cfg.counterfactuals_split),
    }.get(err.origin, ("default", ds.cfg.real_test_split))
    where = f"{ds.source.path} (config {config!r}, split {split!r}) row {err.row}"
    try:
        files = (local_data_files(ds.source.path, config) or {}).get(split, [])
    except (OSError, ValueError):
        files = []
    start = 0
    for path in files:
        rows = pq.ParquetFile(path).metadata.num_rows
        if err.row < start + rows:
            where = f"{path} row {err.row - start}"
            break
        start += rows
    return DataInputError(
        f"--{ds.name} {where}, column {err.column!r}: the image cannot be decoded "
        f"({err.problem}); rebuild the dataset or re-download that shard"
    )


def parse_source(flag: str, text: str) -> SourceRef:
    """`REPO_OR_DIR[@REVISION]`. An existing folder is a folder, also when its name has an `@`
    (`builds/dec@v2`): a Hub id cannot hold one, so only a text that is no local path is split."""
    if text and Path(text).exists():
        return SourceRef(text, None)
    path, _, revision = text.partition("@")
    if not path:
        raise DataInputError(f"--{flag} {text!r}: give a build folder or a Hub dataset id[@revision]")
    return SourceRef(path, revision or None)


def open_datasets(
    name: str,
    source: SourceRef,
    eval_batch_size: int = 64,
    num_workers: int = 0,
    k_values: tuple[int, ...] = (1, 5, 10),
    coco_instances: str | None = None,
) -> list[BenchmarkDataset]:
    """The build given as `--NAME` (`open_dataset`); a renderings dataset given as
    `--counterfactuals` (`generator_configs`) as one dataset per generator config, in the
    dataset's order, each with its pair ids."""
    generators = generator_configs(source) if name == "counterfactuals" else []
    opened = [
        open_dataset(name, source, eval_batch_size, num_workers, k_values, coco_instances, generator)
        for generator in generators or [None]
    ]
    for ds in opened if generators else []:
        ds.pair_ids = _pair_ids(ds)
    return opened


def open_dataset(
    name: str,
    source: SourceRef,
    eval_batch_size: int = 64,
    num_workers: int = 0,
    k_values: tuple[int, ...] = (1, 5, 10),
    coco_instances: str | None = None,
    generator: str | None = None,
) -> BenchmarkDataset:
    """Open one build (a renderings dataset's `generator` config); a missing or wrong kind of
    build is one line naming `--NAME`."""
    cfg = EvalConfig(
        eval_batch_size=eval_batch_size, num_workers=num_workers, k_values=tuple(k_values), **{KINDS[name]: source}
    )
    try:
        held = unmixed_sets(cfg.counterfactuals, cfg.counterfactuals_split, generator or "default")
        data = load_eval_data(cfg, held.heldout_cf, held.train.tables, held.validation)
        if name == "coco":
            cfg = _with_eccv_suite(cfg, data, source, coco_instances)
    except (DataInputError, InputFileError) as err:  # a shard pyarrow cannot read: InputFileError
        raise DataInputError(f"--{name}: {err}") from None
    named = f"{name}/{generator}" if generator else name
    return BenchmarkDataset(named, source, cfg, data, held.records + data.records, generator)


def generator_configs(source: SourceRef) -> list[str]:
    """The configs of `source` named after a generator (`--generator`'s names), in its order: a
    renderings dataset's, one per generator; none for a single build (its config is `default`)."""
    import datasets

    from builders.counterfactuals.generators import GENERATORS

    try:
        configs = datasets.get_dataset_config_names(source.path, revision=source.revision)
    except (OSError, ValueError, RuntimeError, datasets.exceptions.DatasetsError):
        # Read as a single build, whose opening says what is wrong in its own one line.
        return []
    return [c for c in configs if c in GENERATORS]


def _pair_ids(ds: BenchmarkDataset) -> list[str]:
    """The `id` of each of a renderings config's pairs, in their units' order: the generator-bias
    table pairs the generators' rows by it, so each id is one row."""
    pairs = ds.data.cf_pairs
    if pairs is None:
        return []
    table = pairs.tables[pairs.table_of[0]]
    where = f"--counterfactuals {ds.source.path} (config {ds.config!r}, split {ds.cfg.counterfactuals_split!r})"
    if "id" not in table.column_names:
        raise DataInputError(
            f"{where} has no column 'id', the pair id every generator's config shares; combine "
            "coco-counterfactuals builds with `counterfactory renderings`"
        )
    rows = pairs.row[0::2]
    ids = [str(i) for i in table.select_columns(["id"])[rows]["id"]]
    seen: set[str] = set()
    for row, pair in zip(rows, ids, strict=True):
        if pair in seen:
            raise DataInputError(
                f"{where} row {row}: pair id {pair!r} is on two rows; the generators' pairs are "
                "matched by id, so give each pair one row"
            )
        seen.add(pair)
    return ids


def _with_eccv_suite(cfg: EvalConfig, data: EvalData, source: SourceRef, instances: str | None) -> EvalConfig:
    """`cfg` with the ECCV Caption suite (ECCV mAP@R / R-P / R@1, CxC; PMRP with `instances`) on
    the COCO 5K test split, which a report always adds, as `--eval-only --eccv
    [--coco-instances]` scores it; it is defined on those images only, so another split reports
    R@K alone."""
    if not is_coco_5k(data.image_ids):
        if instances:
            raise DataInputError(
                f"{source.path}: --coco-instances (PMRP) needs the COCO 5K test "
                f"split (Karpathy test, 5000 images); this split has "
                f"{len(data.image_ids)}"
            )
        log.info(
            "--coco %s: %d images, not the COCO 5K test split: ECCV Caption, CxC and PMRP "
            "(defined on COCO 5K only) are left out",
            source.path,
            len(data.image_ids),
        )
        return cfg
    if instances:
        data.pm_positives = read_pm_positives(instances)
    return replace(cfg, eccv=True, coco_instances=instances)
