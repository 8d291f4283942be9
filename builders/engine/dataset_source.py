"""Read one split of any `datasets` source (a Hub id or a local folder) chosen on the command line.

`datasets.load_dataset` answers a wrong config or split with a raw `ValueError` traceback
(`Unknown split "train"`). Here the configs and splits are looked up first, so a wrong choice is
one line that lists what exists and names the flags that pick it.

A dataset's cells are data, so no path they name is opened by `datasets`' decoding: columns are
read as stored (`stored_values`: an Image cell stays a `{bytes, path}` dict), and an image is
decoded from the cell's bytes, or from its path only when that lies inside the local dataset
folder (`cell_image_source`; a local image folder's cells carry such paths). A path-only cell of
a Hub dataset, or one leading outside the folder, is `path_outside_root` and never touched.

A folder (or Hub repo) `NAME` holding `NAME.py` is the old loading-script layout, which `datasets`
refuses with a `RuntimeError` traceback; `no_dataset_scripts` makes that one line naming the
folder and the fix. `open_split` is the one way every reader of a user-given dataset (builders,
`show`, the trainer, the MITL gallery) opens a split, so each gets that line.

A local folder's README `configs:` (`data_files`) may name any path: `../other`, `/home/me/x`,
a symlink out, a URL. `local_data_files` lists what `datasets` would read and refuses, in one line
naming the folder and the path, any data file that is not a file inside the folder (`..` and
symlinks resolved, `contained_paths`); `open_split` checks before loading, and a reader that
records digests takes them from that same list, so it records every file read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from builders.engine.contained_paths import ContainedPaths, PathOutsideRoot
from builders.engine.errors import InputFileError, UserFacingError

# How `datasets` (>= 4) starts the error for a dataset that is a loading script.
_SCRIPT_ERROR = "Dataset scripts are no longer supported"
#: A Hub dataset downloaded to the local cache: its files are links into the repo's `blobs/`.
_HUB_SNAPSHOT = re.compile(r"/datasets--[^/]+--[^/]+/snapshots/[^/]+$")
_INSIDE = "keep a dataset folder's data files inside it, named relative to it"


@contextmanager
def no_dataset_scripts(name: str, flag: str) -> Iterator[None]:
    """Turn `datasets`' refusal of a loading-script dataset `name` (given as `flag`) into one line."""
    try:
        yield
    except RuntimeError as err:
        if not str(err).startswith(_SCRIPT_ERROR):
            raise
        script = str(err).rsplit(" ", 1)[-1]
        raise InputFileError(
            name,
            f"holds the loading script {script}, which `datasets` no longer runs",
            f"give {flag} a folder of data files (parquet, csv, json; images with a metadata file) "
            f"without {script}, e.g. the dataset saved once with `Dataset.to_parquet`",
        ) from None


def open_split(
    name: str,
    config: str | None,
    split: str,
    *,
    flag: str = "--dataset",
    revision: str | None = None,
    streaming: bool = False,
    cannot_load: Callable[[Exception], Exception] | None = None,
):
    """`datasets.load_dataset(name, config, split=split)`: how every reader of a user-given
    dataset (given as `flag`) opens one split. A loading-script folder is one line
    (`no_dataset_scripts`); a split that cannot be loaded (`FileNotFoundError`, `ValueError`:
    no such folder, repo, config or split) raises `cannot_load(err)`, the caller's one line."""
    import datasets

    with no_dataset_scripts(name, flag):
        try:
            local_data_files(name, config)
            return datasets.load_dataset(name, config, split=split, revision=revision, streaming=streaming)
        except PathOutsideRoot:
            raise
        except (FileNotFoundError, ValueError) as err:
            if cannot_load is None:
                raise
            raise cannot_load(err) from err
        except datasets.exceptions.DatasetGenerationError as err:
            # A truncated or corrupted shard: the error names no file, so each one is checked.
            raise unreadable_shard(name, config, split, flag, err) from None


def unreadable_shard(name: str, config: str | None, split: str, flag: str, err: Exception) -> Exception:
    """One line naming the data file of `split` that pyarrow cannot read (a truncated or
    corrupted shard of a local folder), or the dataset and split when no single file is at fault."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cause = err.__cause__ or err
    problem = " ".join(str(cause).split())[:200]
    for path in (local_data_files(name, config) or {}).get(split, []):
        try:
            pq.ParquetFile(path).read()
        except (pa.ArrowException, OSError, ValueError) as bad:
            detail = " ".join(str(bad).split())[:200]
            return InputFileError(
                path,
                f"not a readable parquet shard of {name} ({detail})",
                "the file is truncated or corrupted: rebuild the dataset or re-download that shard",
            )
    return UserFacingError(
        f"{flag} {name} (config {config!r}, split {split!r}): cannot read its data "
        f"({type(cause).__name__}: {problem}); rebuild or re-download it"
    )


def local_data_files(name: str, config: str | None) -> dict[str, list[Path]] | None:
    """The data files, by split, that `datasets` reads for `config` of the local folder `name`
    when loading it (`_read_at_load`; absolute, `..` folded, as named under the folder); None
    when `name` is no local folder (a Hub id: its files are the repo's). A file that is not inside the folder once `..` and
    symlinks are resolved, or a URL, is refused (`PathOutsideRoot`, naming the folder and path).
    Raises what `datasets` raises for a wrong config (`ValueError`) or a loading script."""
    import datasets

    folder = Path(name)
    if not folder.is_dir():
        return None
    folder = Path(os.path.abspath(folder))
    real = os.path.realpath(folder)
    # A cached Hub snapshot's files are links into the repo's blobs/, next to snapshots/.
    inside = ContainedPaths(Path(real).parents[1] if _HUB_SNAPSHOT.search(real) else folder)
    builder = datasets.load_dataset_builder(str(folder), config)
    files = builder.config.data_files or {}
    out: dict[str, list[Path]] = {}
    for split, names in files.items():
        for data_file in filter(_read_at_load(builder), names):
            path = Path(os.path.normpath(os.path.join(folder, data_file)))
            if "://" in data_file or not path.is_relative_to(folder):
                shown = data_file if "://" in data_file else path
                raise PathOutsideRoot(
                    folder, f"its README `configs:` names the data file {shown}, outside the folder", _INSIDE
                )
            try:
                inside.resolve(str(path))
            except PathOutsideRoot:
                raise PathOutsideRoot(
                    folder, f"its data file {path.relative_to(folder)} is a link to a file outside the folder", _INSIDE
                ) from None
            out.setdefault(str(split), []).append(path)
    return out


def load_dataset_split(
    name: str,
    config: str | None,
    split: str,
    *,
    config_flag: str = "--dataset-config",
    split_flag: str = "--dataset-split",
):
    """`open_split` after checking that `config` and `split` exist: a wrong choice is one line
    listing the configs and splits there are and the flags that pick them."""
    with no_dataset_scripts(name, "--dataset"):
        _check_split(name, config, split, config_flag, split_flag)
    return open_split(name, config, split)


def _check_split(name: str, config: str | None, split: str, config_flag: str, split_flag: str) -> None:
    import datasets

    try:
        configs = datasets.get_dataset_config_names(name)
    except (OSError, ValueError) as err:  # not found (FileNotFoundError), no network (ConnectionError)
        raise InputFileError(
            name,
            f"cannot open this dataset ({type(err).__name__}: {err})",
            "give a Hub id ORG/NAME or a local dataset folder",
        ) from None
    if config is None and len(configs) > 1 and "default" not in configs:
        raise InputFileError(name, f"has several configs ({', '.join(configs)})", f"pick one with {config_flag} NAME")
    if config is not None and config not in configs:
        raise InputFileError(
            name, f"has no config {config!r} (configs: {', '.join(configs)})", f"pick one with {config_flag} NAME"
        )
    chosen = config or ("default" if "default" in configs else configs[0])
    local_data_files(name, chosen)  # before the split names, whose lookup reads a file's schema
    splits = datasets.get_dataset_split_names(name, chosen)
    if split not in splits:
        available = "; ".join(f"{c}: {', '.join(datasets.get_dataset_split_names(name, c))}" for c in configs)
        raise InputFileError(
            name,
            f"config {chosen!r} has no split {split!r} (splits by config: {available})",
            f"pick them with {config_flag} NAME {split_flag} SPLIT",
        )


def _read_at_load(builder) -> Callable[[str], bool]:
    """Which data files loading reads: all of a table's; of an image (audio, ...) folder only its
    metadata files, since its media files become cells holding their path, never opened at load
    (`cell_image_source` checks each when it is read: a counted `path_outside_root`)."""
    from datasets.packaged_modules.folder_based_builder.folder_based_builder import FolderBasedBuilder

    if not isinstance(builder, FolderBasedBuilder):
        return lambda name: True
    metadata = set(builder.config.metadata_filenames or builder.METADATA_FILENAMES)
    return lambda name: os.path.basename(name) in metadata


def stored_values(ds, column: str) -> list:
    """A column's values as stored, never decoded (an Image cell is its `{bytes, path}` dict)."""
    return ds.with_format("arrow")[column].to_pylist()


@lru_cache(maxsize=8)
def _folder_paths(folder: str) -> ContainedPaths:
    return ContainedPaths(folder)


def cell_image_source(dataset: str, cell: dict, where: str) -> bytes | Path:
    """What to decode for the Image cell `cell` of `dataset`: its bytes, else the file its path
    names, which must lie inside the local dataset folder (relative paths are relative to it)."""
    if cell.get("bytes"):
        return cell["bytes"]
    if not Path(dataset).is_dir():
        raise PathOutsideRoot(
            where,
            f"the image cell has no bytes, only the local path "
            f"{cell.get('path')!r}, in a dataset that is no local folder",
            "publish the dataset with its images embedded",
        )
    return _folder_paths(str(Path(dataset).resolve())).resolve(cell.get("path") or "")
