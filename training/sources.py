"""Reading our datasets by repo id + revision (or a local build folder), with clear input errors.

Every table is opened with `load_dataset` (`open_split`: memory-mapped Arrow; nothing is
decoded; a loading-script folder is one line), its image columns are switched to undecoded bytes
so the DataLoader workers decode them, and the run records what it read: path, revision, resolved
commit and row counts. An image cell without bytes (path-only, `{"bytes": None, "path": ...}`)
is a one-line error naming the table, row and path; the path is never opened.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import datasets

from builders.engine.dataset_source import open_split
from builders.engine.errors import UserFacingError
from training.config import SourceRef

log = logging.getLogger(__name__)

#: The trainer's options that name a dataset (a one-line error tells which to fix).
DATASET_FLAGS = "--real / --decorrelation / --counterfactuals"


class DataInputError(UserFacingError, ValueError):
    """A training or evaluation dataset cannot be used as given."""


@dataclass
class TableRecord:
    """What one opened table was: recorded in the run and the model card."""

    path: str
    revision: str | None
    commit: str | None
    config: str
    split: str
    rows: int


def resolve_commit(ref: SourceRef) -> str | None:
    """The commit a Hub repo's revision points to (None for local folders). A revision that
    does not exist fails here, before any data is read."""
    if Path(ref.path).exists():
        if ref.revision is not None:
            raise DataInputError(
                f"{ref.path} is a local folder, so --*-revision {ref.revision!r} "
                "cannot apply; drop the revision or give the Hub repo id"
            )
        return None
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        HfHubHTTPError,
        HFValidationError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return HfApi().dataset_info(ref.path, revision=ref.revision).sha
    except HFValidationError:  # a missing folder's path is no repo id either (`/data/x`, `a/b/c`)
        raise DataInputError(
            f"dataset {ref.path}: no such local folder, and not a Hub repo id (ORG/NAME); check the path"
        ) from None
    except RevisionNotFoundError:
        raise DataInputError(
            f"dataset {ref.path}: revision {ref.revision!r} does not exist; list "
            "its tags with `HfApi().list_repo_refs(repo_id, repo_type='dataset')`"
        ) from None
    except RepositoryNotFoundError:
        raise DataInputError(
            f"dataset {ref.path} is neither a local folder nor a Hub dataset repo "
            "(check the path / repo id and HF_TOKEN)"
        ) from None
    except HfHubHTTPError as err:
        raise DataInputError(f"dataset {ref.path}: the Hub answered {err}") from None


def open_table(
    ref: SourceRef, config: str, split: str, needed: dict[str, type], commit: str | None = None
) -> tuple[datasets.Dataset, TableRecord]:
    """One split of one config, with image columns undecoded.

    `needed` maps column -> `datasets.Image` or `object` (any type); a missing column or a
    non-image column where an image is needed raises a one-line error naming the table.
    """
    where = f"{ref.path}{'@' + ref.revision if ref.revision else ''} (config {config!r}, split {split!r})"

    def cannot_load(err: Exception) -> DataInputError:
        if isinstance(err, FileNotFoundError):
            return DataInputError(f"{where}: not found ({str(err)[:200]})")
        return DataInputError(
            f"{where}: cannot load it ({str(err)[:200]}); check the config and "
            "split names in the dataset card's `configs:`"
        )

    ds = open_split(ref.path, config, split, flag=DATASET_FLAGS, revision=ref.revision, cannot_load=cannot_load)
    missing = [c for c in needed if c not in ds.column_names]
    if missing:
        raise DataInputError(
            f"{where} has no column(s) {missing} (it has {ds.column_names}); "
            "pass the matching build of the project (coco-captions, decorrelation "
            "or coco-counterfactuals)"
        )
    for column, kind in needed.items():
        if kind is datasets.Image:
            if not isinstance(ds.features[column], datasets.Image):
                raise DataInputError(f"{where}: column {column!r} is {ds.features[column]}, not an image column")
            ds = ds.cast_column(column, datasets.Image(decode=False))
            require_image_bytes(ds, column, where)
    record = TableRecord(ref.path, ref.revision, commit, config, split, len(ds))
    log.info("read %s: %d rows", where, len(ds))
    return ds, record


def column_values(ds: datasets.Dataset, name: str) -> list:
    """Column `name` of `ds` as a list, read once through Arrow. Start-up code reads columns
    this way, never `ds[name][row]` row by row: each such read is a `Dataset.__getitem__`, which
    under datasets 5.x deep-copies the table's replay list (~1.3 ms a row, issue #44)."""
    return ds.select_columns([name]).with_format("arrow")[name].to_pylist()


def require_image_bytes(ds: datasets.Dataset, column: str, where: str) -> None:
    """Every cell of image column `column` must hold its image's bytes: the DataLoader decodes
    bytes only, and a cell that names a file (`{"bytes": None, "path": ...}`) names one of the
    user's files, chosen by whoever made the dataset, so it is refused here, never opened."""
    import numpy as np
    import pyarrow.compute as pc

    cells = ds.with_format("arrow")[column]
    no_bytes = pc.equal(pc.fill_null(pc.binary_length(pc.struct_field(cells, "bytes")), 0), 0)
    rows = np.flatnonzero(no_bytes.to_numpy(zero_copy_only=False))
    if len(rows):
        first = cells[int(rows[0])].as_py()
        named = f"path {first['path']!r}" if first else "no cell"
        raise DataInputError(
            f"{where}: {len(rows)} cell(s) of image column {column!r} hold no "
            f"image bytes (row {rows[0]}: {named}); training reads image bytes "
            "only, never a file a dataset names: rebuild or republish the dataset "
            "with its images embedded"
        )


def split_names(ref: SourceRef, config: str) -> list[str]:
    """The splits of `config` in dataset `ref` (at its revision), in the dataset's order."""
    try:
        return list(datasets.get_dataset_split_names(ref.path, config, revision=ref.revision))
    except (OSError, ValueError) as err:
        raise DataInputError(f"{ref.path} (config {config!r}): cannot list its splits ({str(err)[:200]})") from None
