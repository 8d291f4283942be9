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
    name: str  # coco, decorrelation or counterfactuals
    source: SourceRef
    cfg: EvalConfig  # how it is scored: as `--eval-only` scores it
    data: EvalData
    tables: list = field(default_factory=list)  # TableRecord of every table read

    def provenance(self) -> dict:
        """Where the numbers come from: the repo/folder (local folders named by content), the
        revision asked for and the commit it resolved to."""
        first = self.tables[0]
        # A local build by its name and content digest (local:NAME@sha256:...), never by a path
        # of this machine: the records are shared (results.jsonl, --push-to-hub).
        source = model_name(first.path) if first.commit is None else first.path
        return {"dataset_source": source, "dataset_revision": first.revision, "dataset_commit": first.commit}


def locate(ds: BenchmarkDataset, err: UndecodableImage) -> DataInputError:
    """`err` as one line naming the flag, the shard file (of a local build) and its row there."""
    config, split = {
        "decorrelation": ("odmap_queries", "test"),
        "counterfactual": ("default", ds.cfg.counterfactuals_split),
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


def open_dataset(
    name: str,
    source: SourceRef,
    eval_batch_size: int = 64,
    num_workers: int = 0,
    k_values: tuple[int, ...] = (1, 5, 10),
    coco_instances: str | None = None,
) -> BenchmarkDataset:
    """Open one build; a missing or wrong kind of build is one line naming `--NAME`."""
    cfg = EvalConfig(
        eval_batch_size=eval_batch_size, num_workers=num_workers, k_values=tuple(k_values), **{KINDS[name]: source}
    )
    try:
        held = unmixed_sets(cfg.counterfactuals, cfg.counterfactuals_split)
        data = load_eval_data(cfg, held.heldout_cf, held.train.tables, held.validation)
        if name == "coco":
            cfg = _with_eccv_suite(cfg, data, source, coco_instances)
    except (DataInputError, InputFileError) as err:  # a shard pyarrow cannot read: InputFileError
        raise DataInputError(f"--{name}: {err}") from None
    return BenchmarkDataset(name, source, cfg, data, held.records + data.records)


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
