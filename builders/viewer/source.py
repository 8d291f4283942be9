"""Where a gallery's rows come from: a local build folder or a Hub dataset at a revision.

Both are opened the way users open them, with `load_dataset`, streaming (features, configs and
splits checked by `datasets`), with no Arrow copy of a possibly large build, and no cache entry —
`load_dataset` caches a local folder under its base name, so a rebuilt `out/cf` (or another
folder named `cf`) would otherwise show the rows of an earlier one. The rows of parquet shards
(every build's) are then read straight from the files, one row group and a few rows at a time,
so memory is bounded by a page plus a row group whatever the split size: iterating the streaming
`IterableDataset` kept memory growing with the rows read (issue 25: 9 GB for 20,000 rows). Before that, the README's `configs:`
(and `dataset_info` features) are read to pick the config and split and to refuse, in one line,
a folder that is not a build, a repo or revision that does not exist, or a config without image
columns. The build manifest (skip counts per reason) is read when there is one.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

from builders.engine.dataset_source import open_split
from builders.engine.errors import InputFileError, UserFacingError

log = logging.getLogger(__name__)

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.S)


@dataclass(frozen=True)
class GallerySourceConfig:
    """What to show. Example: `GallerySourceConfig("out/cf")`,
    `GallerySourceConfig("org/cf", revision="v1.0.0")`."""

    #: A build folder (README.md with `configs:` + data/*.parquet) or a Hub dataset id ORG/NAME.
    target: str
    #: Hub revision (tag, branch or commit); None: the default branch. Only for Hub datasets.
    revision: str | None = None
    #: Config to show; None: `default` when it has images, else the first config with images.
    config: str | None = None
    #: Split to show; None: the config's first split.
    split: str | None = None


@dataclass
class GallerySource:
    """One split of one build, ready to iterate."""

    #: Shown in page titles, e.g. "out/cf" or "org/cf@v1.0.0".
    title: str
    config: str
    split: str
    #: Column name -> `datasets` feature (nothing decoded: images are raw cells, see `rows`).
    features: dict[str, Any]
    #: The split as a streaming `IterableDataset`.
    dataset: Any = field(repr=False)
    #: build_manifest.json when the build has one (skip/error counts per reason).
    manifest: dict[str, Any] | None = field(default=None, repr=False)
    #: The split's data files (local paths or hf:// URLs) when all are parquet, else None.
    parquet_files: list[str] | None = field(default=None, repr=False)

    def rows(self, batch_size: int = 8) -> Iterator[dict[str, Any]]:
        """Rows in order; image columns as {"bytes", "path"} (decoding is the thumbnailer's, from
        the bytes only). Only `batch_size` rows are Python objects at a time."""
        if self.parquet_files is None:  # another format (json, csv, an image folder)
            for batch in self.dataset.iter(batch_size=batch_size):
                names = list(batch)
                for values in zip(*(batch[n] for n in names), strict=True):
                    yield dict(zip(names, values, strict=True))
            return
        for url in self.parquet_files:
            yield from _parquet_rows(url, batch_size)

    @property
    def image_columns(self) -> list[str]:
        return image_columns(self.features)


def _parquet_rows(url: str, batch_size: int) -> Iterator[dict[str, Any]]:
    """The rows of one parquet file, read a row group at a time (one reader per group: a reader
    over all groups kept earlier groups' buffers alive), `batch_size` rows as Python at a time."""
    import fsspec
    import pyarrow.parquet as pq

    with fsspec.open(url, "rb") as fh:
        parquet = pq.ParquetFile(fh)
        for group in range(parquet.num_row_groups):
            for batch in parquet.iter_batches(batch_size=batch_size, row_groups=[group]):
                yield from batch.to_pylist()


def _parquet_files(name: str, config: str, split: str, revision: str | None) -> list[str] | None:
    """The split's data files as `datasets` resolves them, when all are parquet; else None."""
    import datasets

    builder = datasets.load_dataset_builder(name, config, revision=revision)
    files = [str(f) for f in (builder.config.data_files or {}).get(split) or []]
    return files if files and all(f.endswith(".parquet") for f in files) else None


def image_columns(features: dict[str, Any]) -> list[str]:
    import datasets

    return [name for name, f in features.items() if isinstance(f, datasets.Image)]


def _front_matter(readme: Path, where: str) -> dict[str, Any]:
    match = _FRONT_MATTER.match(readme.read_text(encoding="utf-8"))
    meta = yaml.safe_load(match.group(1)) if match else None
    if not isinstance(meta, dict) or not meta.get("configs"):
        raise InputFileError(
            where,
            "is not a build: its README.md has no YAML `configs:`",
            "give a folder written by `counterfactory build` or a Hub dataset id ORG/NAME",
        )
    return meta


def _fetch_hub_file(repo_id: str, name: str, revision: str | None) -> Path | None:
    """Download one file of a dataset repo; None when the repo has no such file."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    at = f"{repo_id}@{revision}" if revision else repo_id
    try:
        return Path(hf_hub_download(repo_id, name, repo_type="dataset", revision=revision))
    except RevisionNotFoundError:
        raise UserFacingError(
            f"{at}: the dataset has no revision {revision!r} (list its tags "
            "and branches on the Hub, or drop --revision for the main "
            "branch)"
        ) from None
    except RepositoryNotFoundError:
        raise UserFacingError(
            f"{repo_id}: no such dataset repo on the Hub, or it is private "
            "(check the id, log in with `hf auth login`, or give a local "
            "build folder)"
        ) from None
    except EntryNotFoundError:
        return None
    except OSError as err:  # connection refused / offline
        raise UserFacingError(
            f"{at}: cannot reach the Hub ({type(err).__name__}: {err}); check the network or HF_ENDPOINT"
        ) from None


def _locate(cfg: GallerySourceConfig) -> tuple[str, Path, Path | None, str]:
    """(name for load_dataset, README path, manifest path or None, title)."""
    folder = Path(cfg.target)
    if folder.is_dir():
        if cfg.revision:
            raise UserFacingError(
                f"--revision {cfg.revision} applies to Hub datasets only; "
                f"{cfg.target} is a local folder (drop --revision)"
            )
        readme = folder / "README.md"
        if not readme.is_file():
            raise InputFileError(
                cfg.target,
                "is not a build folder: no README.md",
                "give a folder written by `counterfactory build` (README.md with "
                "`configs:` + data/*.parquet) or a Hub dataset id ORG/NAME",
            )
        manifest = folder / "build_manifest.json"
        return str(folder), readme, manifest if manifest.is_file() else None, cfg.target
    if folder.exists() or not _REPO_ID.match(cfg.target):
        raise InputFileError(
            cfg.target,
            "is neither a build folder nor a Hub dataset id",
            "give a folder written by `counterfactory build` or ORG/NAME",
        )
    readme = _fetch_hub_file(cfg.target, "README.md", cfg.revision)
    title = f"{cfg.target}@{cfg.revision}" if cfg.revision else cfg.target
    if readme is None:
        raise UserFacingError(
            f"{title}: the dataset has no README.md, so it is not a build (publish one with `counterfactory publish`)"
        )
    return cfg.target, readme, _fetch_hub_file(cfg.target, "build_manifest.json", cfg.revision), title


def _has_image(features_yaml: list[dict[str, Any]] | None) -> bool:
    return any(f.get("dtype") == "image" for f in features_yaml or [])


def choose_split(meta: dict[str, Any], cfg: GallerySourceConfig, where: str) -> tuple[str, str]:
    """The (config, split) to show, checked against the README's `configs:`."""
    configs = {
        c["config_name"]: [d["split"] for d in c.get("data_files") or [] if isinstance(d, dict)]
        for c in meta["configs"]
    }
    infos = {
        i.get("config_name", "default"): i.get("features")
        for i in meta.get("dataset_info") or []
        if isinstance(i, dict)
    }
    with_images = [c for c in configs if _has_image(infos.get(c))]
    if cfg.config is not None and cfg.config not in configs:
        raise InputFileError(
            where, f"has no config {cfg.config!r} (configs: {', '.join(configs)})", "pick one with --config NAME"
        )
    if cfg.config is not None:
        config = cfg.config
    elif with_images:
        config = "default" if "default" in with_images else with_images[0]
    else:
        config = "default" if "default" in configs else next(iter(configs))
    if infos.get(config) is not None and not _has_image(infos[config]):
        raise InputFileError(
            where,
            f"config {config!r} has no image column, so there is nothing to show",
            f"pick a config with images with --config ({', '.join(with_images) or 'this build has none'})",
        )
    splits = configs[config]
    if cfg.split is not None and cfg.split not in splits:
        raise InputFileError(
            where,
            f"config {config!r} has no split {cfg.split!r} (splits: {', '.join(splits)})",
            "pick one with --split NAME",
        )
    if not splits:
        raise InputFileError(where, f"config {config!r} lists no data files", "rebuild or republish it")
    return config, cfg.split or splits[0]


def open_source(cfg: GallerySourceConfig) -> GallerySource:
    """Resolve `cfg` to one split, streamed with `load_dataset` (nothing decoded)."""
    name, readme, manifest_path, title = _locate(cfg)
    config, split = choose_split(_front_matter(readme, title), cfg, title)
    ds = open_split(name, config, split, flag="`show`", revision=cfg.revision, streaming=True)
    images = image_columns(ds.features)
    if not images:
        raise InputFileError(
            title,
            f"config {config!r} has no image column, so there is nothing to show",
            "pick a config with images with --config",
        )
    # No decoding by `datasets`, of any column: it would open the local file a cell's `path`
    # names, and a dataset (maybe someone else's, from the Hub) may name any file of the user's.
    # Casting the image columns alone would leave nested images (a list of images, a struct
    # holding one), audio and video decoded.
    ds = ds.decode(False)
    manifest = json.loads(manifest_path.read_text()) if manifest_path else None
    log.info("%s: %s/%s, image columns %s", title, config, split, images)
    return GallerySource(
        title=title,
        config=config,
        split=split,
        features=dict(ds.features),
        dataset=ds,
        manifest=manifest,
        parquet_files=_parquet_files(name, config, split, cfg.revision),
    )
