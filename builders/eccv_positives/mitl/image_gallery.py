"""The retrieval gallery of a MITL round: images and captions, with ids, from one of two sources.

- a COCO download (`Gallery.from_coco`): Karpathy splits, COCO image and caption ids, image files
  under the root (so tasks can link them and the new version can embed them);
- any `datasets` image-caption dataset (`Gallery.from_dataset`, a Hub id or a local folder): an
  image column and a text column holding one caption or a list of them; ids from id columns when
  given, else row numbers (images) and running numbers (captions). Images are read back from the
  dataset, so tasks reference them by `{image_id}` or embedded thumbnails.

No file outside the source is read: a COCO record the reader marked malformed (a `file_name`
outside the root is `path_outside_root`) and a dataset row whose image cell has no bytes and a
path outside the local dataset folder (`builders.engine.dataset_source.cell_image_source`) are left
out of the gallery and counted (`left_out`, recorded in candidates.json); image files named in a
candidates file are checked against its root again before they are opened.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Sequence

from builders.engine.contained_paths import ContainedPaths, PathOutsideRoot
from builders.engine.dataset_source import cell_image_source, open_split, stored_values
from builders.engine.errors import InputFileError, UserFacingError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DatasetSource:
    """Example: `DatasetSource("out/coco-captions", split="test", text_column="captions")`."""

    path: str
    config: str | None = None
    split: str = "test"
    image_column: str = "image"
    #: A string column (one caption per row) or a list-of-strings column.
    text_column: str = "caption"
    #: Optional id columns (int, or a list of ints aligned with a list text column).
    image_id_column: str | None = None
    caption_id_column: str | None = None


@lru_cache(maxsize=2)
def _load(source: DatasetSource):
    import datasets

    ds = open_split(
        source.path,
        source.config,
        source.split,
        cannot_load=lambda err: UserFacingError(
            f"cannot load the gallery dataset {source.path!r} (config {source.config}, split {source.split}): {err}"
        ),
    )
    wanted = [
        c for c in (source.image_column, source.text_column, source.image_id_column, source.caption_id_column) if c
    ]
    missing = [c for c in wanted if c not in ds.column_names]
    if missing:
        raise UserFacingError(
            f"{source.path}: no column(s) {missing} (columns: {ds.column_names}); "
            "set --image-column / --text-column / --*-id-column"
        )
    if not isinstance(ds.features[source.image_column], datasets.Image):
        raise UserFacingError(
            f"{source.path}: column {source.image_column!r} is "
            f"{ds.features[source.image_column]}, not an image column; set --image-column"
        )
    # Cells are decoded here, from their bytes or a checked path, never by `datasets`.
    return ds.cast_column(source.image_column, datasets.Image(decode=False))


@lru_cache(maxsize=64)
def _folder_paths(root: Path, folder: str) -> ContainedPaths:
    return ContainedPaths(root, folder)


def _usable_rows(source: DatasetSource, ds) -> tuple[list[int], dict[str, int]]:
    """Rows whose image can be read (bytes, or a path inside the local folder), and the reasons
    of the others."""
    import pyarrow.compute as pc

    cells = ds.with_format("arrow")[source.image_column]
    has_bytes = pc.fill_null(pc.greater(pc.binary_length(pc.struct_field(cells, "bytes")), 0), False)
    paths = pc.struct_field(cells, "path").to_pylist()
    rows, reasons, details = [], Counter(), []
    for row, (stored, path) in enumerate(zip(has_bytes.to_pylist(), paths, strict=True)):
        if not stored:
            try:
                cell_image_source(source.path, {"bytes": None, "path": path}, f"{source.path} row {row}")
            except PathOutsideRoot as err:
                reasons[err.reason] += 1
                details.append(str(err))
                continue
        rows.append(row)
    return rows, _log_left_out(reasons, details)


def _log_left_out(reasons: Counter, details: list[str]) -> dict[str, int]:
    if reasons:
        log.warning(
            "left %d image(s) out of the gallery (%s), e.g. %s",
            sum(reasons.values()),
            ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items())),
            details[0],
        )
    return dict(sorted(reasons.items()))


@dataclass(frozen=True)
class Gallery:
    """Images and captions; `image_files` are paths under `root` (COCO) or empty (dataset)."""

    root: Path
    image_ids: list[int]
    image_files: list[str]
    caption_ids: list[int]
    caption_image_ids: list[int]
    captions: list[str]
    dataset: DatasetSource | None = None
    #: Dataset galleries: the dataset row of each image (rows may be left out).
    image_rows: list[int] = field(default_factory=list)
    #: Images left out of the gallery, by reason (not serialised: candidates.json records it).
    left_out: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_coco(cls, root: str | Path, splits: Sequence[str]) -> Gallery:
        from loading_scripts.coco import CocoSourceConfig, read_coco

        root = Path(root)
        records = read_coco(CocoSourceConfig(root, karpathy_splits=tuple(splits), with_instances=False))
        # A malformed record is left out whole (its captions too), as the builders skip it.
        bad = [r.input_problem for r in records if r.input_problem is not None]
        left_out = _log_left_out(Counter(p.reason for p in bad), [p.detail for p in bad])
        records = [r for r in records if r.input_problem is None]
        if not records:
            raise UserFacingError(
                f"{root}: no usable image of the Karpathy split(s) {list(splits)} "
                f"(check --splits and dataset_coco.json; left out: {left_out})"
            )
        caps = [(c.caption_id, r.image_id, c.text) for r in records for c in r.captions]
        return cls(
            root=root,
            image_ids=[r.image_id for r in records],
            image_files=[f"{r.folder}/{os.path.relpath(r.path, root / r.folder)}" for r in records],
            caption_ids=[c[0] for c in caps],
            caption_image_ids=[c[1] for c in caps],
            captions=[c[2] for c in caps],
            left_out=left_out,
        )

    @classmethod
    def from_dataset(cls, source: DatasetSource) -> Gallery:
        ds = _load(source)
        rows, left_out = _usable_rows(source, ds)
        if not rows:
            raise UserFacingError(
                f"{source.path}: no row with a usable image (left out: {left_out}); "
                "embed the images as bytes, or keep their files inside the dataset folder"
            )
        texts = stored_values(ds, source.text_column)
        image_ids = stored_values(ds, source.image_id_column) if source.image_id_column else list(range(len(ds)))
        cap_ids = stored_values(ds, source.caption_id_column) if source.caption_id_column else None
        caption_ids, caption_images, captions = [], [], []
        for row in rows:
            image, text = image_ids[row], texts[row]
            many = isinstance(text, list)
            row_texts = text if many else [text]
            ids = cap_ids[row] if cap_ids is not None else None
            if ids is not None and not isinstance(ids, list):
                ids = [ids]
            if ids is not None and len(ids) != len(row_texts):
                raise UserFacingError(f"{source.path} row {row}: {len(row_texts)} captions but {len(ids)} caption ids")
            for j, caption in enumerate(row_texts):
                caption_ids.append(int(ids[j]) if ids is not None else len(caption_ids))
                caption_images.append(int(image))
                captions.append(str(caption))
        image_ids = [image_ids[row] for row in rows]
        for name, values in (("image", image_ids), ("caption", caption_ids)):
            if len(set(values)) != len(values):
                raise UserFacingError(
                    f"{source.path}: {name} ids are not unique; pass an id "
                    f"column with unique ids (--{name}-id-column) or none"
                )
        return cls(
            root=Path(source.path),
            image_ids=[int(i) for i in image_ids],
            image_files=[""] * len(image_ids),
            caption_ids=caption_ids,
            caption_image_ids=caption_images,
            captions=captions,
            dataset=source,
            image_rows=rows,
            left_out=left_out,
        )

    def image_path(self, n: int) -> Path:
        """A COCO gallery's n-th image file, checked to lie inside the root (the file names may
        come from an edited candidates file)."""
        folder, _, name = self.image_files[n].partition("/")
        return _folder_paths(self.root, folder).resolve(name)

    def open_image(self, n: int):
        """The n-th gallery image as an RGB PIL image."""
        from loading_scripts.images import open_rgb_image

        if self.dataset is None:
            return open_rgb_image(self.image_path(n))
        row = self.image_rows[n] if self.image_rows else n
        where = f"{self.dataset.path} row {row}"
        cell = _load(self.dataset)[row][self.dataset.image_column]
        return open_rgb_image(cell_image_source(self.dataset.path, cell, where), name=where)

    @cached_property
    def image_row(self) -> dict[int, int]:
        """Image id -> its row (index) in the gallery."""
        return {i: n for n, i in enumerate(self.image_ids)}

    @cached_property
    def caption_row(self) -> dict[int, int]:
        """Caption id -> its row (index) in the gallery."""
        return {c: n for n, c in enumerate(self.caption_ids)}

    @cached_property
    def caption_image(self) -> dict[int, int]:
        """Caption id -> the image it was written for (the original pairs)."""
        return dict(zip(self.caption_ids, self.caption_image_ids, strict=True))

    def digest(self) -> str:
        blob = json.dumps(
            [
                self.image_ids,
                self.image_files,
                self.caption_ids,
                self.captions,
                asdict(self.dataset) if self.dataset else None,
            ]
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def files_fingerprint(self) -> str:
        """Size and mtime of every image file (COCO) or of the dataset's Arrow cache files.

        `digest` covers ids and texts only; an image replaced in place (or a dataset re-prepared
        from changed files, which `datasets` writes under a new cache file name) changes this, so
        embeddings cached for the old pixels are not reused. Stats, not content hashes, so a cache
        hit does not read every image."""
        if self.dataset is None:  # named under the root: the same files reached another way match
            files = [(f, self.image_path(n)) for n, f in enumerate(self.image_files)]
        else:
            files = [(f["filename"], Path(f["filename"])) for f in _load(self.dataset).cache_files]
        stats = []
        for name, path in files:
            try:
                st = path.stat()
            except OSError as err:
                raise InputFileError(
                    path,
                    f"gallery file cannot be read ({err.strerror})",
                    "restore it, or run `counterfactory eccv candidates` again on the gallery as it is now",
                ) from err
            stats.append((name, st.st_size, st.st_mtime_ns))
        return hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "dataset": asdict(self.dataset) if self.dataset else None,
            "images": [
                {"image_id": i, "file": f, **({"row": r} if self.image_rows else {})}
                for i, f, r in zip(self.image_ids, self.image_files, self.image_rows or self.image_ids, strict=True)
            ],
            "captions": [
                {"caption_id": c, "image_id": i, "text": t}
                for c, i, t in zip(self.caption_ids, self.caption_image_ids, self.captions, strict=True)
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Gallery:
        return cls(
            root=Path(data["root"]),
            image_ids=[x["image_id"] for x in data["images"]],
            image_files=[x["file"] for x in data["images"]],
            caption_ids=[x["caption_id"] for x in data["captions"]],
            caption_image_ids=[x["image_id"] for x in data["captions"]],
            captions=[x["text"] for x in data["captions"]],
            dataset=DatasetSource(**data["dataset"]) if data.get("dataset") else None,
            image_rows=[x.get("row", n) for n, x in enumerate(data["images"])] if data.get("dataset") else [],
        )
