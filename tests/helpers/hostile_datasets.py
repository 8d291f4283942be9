"""Datasets as someone else publishes them (no build, no view), for the gallery's safety tests:
a README with `configs:` and one parquet shard written with pyarrow."""

from __future__ import annotations

import io
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from PIL import Image

#: The colour of an image the gallery shows.
SHOWN_RGB = (200, 20, 20)


def encoded(color: tuple[int, int, int], fmt: str = "JPEG", size: tuple[int, int] = (64, 48)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, fmt)
    return buf.getvalue()


FEATURES = datasets.Features(
    {"image": datasets.Image(), "extras": datasets.List(datasets.Image()), "caption": datasets.Value("string")}
)


def write_dataset(folder: Path, rows: list[dict], features: datasets.Features = FEATURES) -> Path:
    """A dataset folder as on the Hub: README.md with `configs:` + features, one parquet shard
    written with pyarrow (so `datasets` does not embed the files the path-only cells name)."""
    (folder / "data").mkdir(parents=True)
    table = pa.Table.from_pylist(rows, schema=features.arrow_schema)
    pq.write_table(table, folder / "data" / "test-00000-of-00001.parquet")
    meta = {
        "configs": [{"config_name": "default", "data_files": [{"split": "test", "path": "data/test-*.parquet"}]}],
        "dataset_info": [{"config_name": "default", "features": features._to_yaml_list()}],
    }
    (folder / "README.md").write_text(f"---\n{yaml.safe_dump(meta)}---\n# someone else's dataset\n")
    return folder
