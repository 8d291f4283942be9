"""A "renderings" dataset (issue #37 §2; the layout of the helpers' contract) made by hand from
tiny coco-counterfactuals builds of one caption-pair table: each generator's `default/test`
shards under `data/<G>/`, one README config per generator (the first `default: true`), as the
`renderings` command writes it. Kept small: a few pairs per build, the image stage only."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq

from builders.app.cli import main as cli_main

from helpers.build_helpers import table_images_argv

#: The caption-pair table every generator renders (ids are the pairs' ids in every config).
PAIRS = [
    ("A17", "A man riding a horse on a beach.", "A man riding a cow on a beach."),
    ("9", "Two dogs sleep on the couch.", "Two cats sleep on the couch."),
    ("B3", "A red car parked on the street.", "A blue car parked on the street."),
]
IMAGE_ARGS = ["--image-size", "64", "--steps", "2", "--candidates", "2", "--candidate-batch", "2"]


def generator_build(root: Path, tiny: Path, generator: str, pairs=PAIRS) -> Path:
    """`counterfactory build coco-counterfactuals --stage images --captions-from TABLE
    --generator G` with the tiny profile; its output folder."""
    root.mkdir(parents=True, exist_ok=True)
    table = root / "pairs.tsv"
    table.write_text("".join("\t".join(p) + "\n" for p in pairs))
    out = root / "out"
    argv = table_images_argv(table, tiny, out, "--generator", generator, "--max-error-fraction", "1", *IMAGE_ARGS)
    with mock.patch.object(sys, "argv", ["counterfactory", *argv]):
        assert cli_main(argv) == 0
    return out


def split_rows(build: Path) -> pa.Table:
    """The `default` config's test split of a build, as one table."""
    return pa.concat_tables(pq.read_table(p) for p in sorted((build / "data").glob("test-*.parquet")))


def write_renderings(out: Path, tables: dict[str, pa.Table], captions: pa.Table | None = None) -> Path:
    """A renderings folder: generator -> its rows, in config order (the first is the default),
    then the shared caption-pair table `captions` when given."""
    lines = ["---", "configs:"]
    for n, (config, table) in enumerate({**tables, **({"captions": captions} if captions else {})}.items()):
        (out / "data" / config).mkdir(parents=True, exist_ok=True)
        pq.write_table(table, out / "data" / config / "test-00000-of-00001.parquet")
        lines += [f"- config_name: {config}", *(["  default: true"] if n == 0 else [])]
        lines += ["  data_files:", "  - split: test", f"    path: data/{config}/test-*"]
    (out / "README.md").write_text("\n".join([*lines, "---", "", "# renderings", ""]))
    return out


def caption_table(pairs) -> pa.Table:
    """The shared caption-pair table of `pairs` ((id, caption_0, caption_1) each)."""
    return pa.table({name: [p[k] for p in pairs] for k, name in enumerate(("id", "caption_0", "caption_1"))})


def plain_build(out: Path, table: pa.Table) -> Path:
    """A single-config counterfactuals folder of `table` (a plain build's layout)."""
    (out / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out / "data" / "test-00000-of-00001.parquet")
    return out


def as_generator(table: pa.Table, generator: str) -> pa.Table:
    """`table` with every row's `generator` column set to `generator` (images unchanged)."""
    column = table.schema.get_field_index("generator")
    return table.set_column(column, "generator", pa.array([generator] * len(table), table.schema.field(column).type))


def without_ids(table: pa.Table, ids: set[str]) -> pa.Table:
    return table.filter(pa.array([i not in ids for i in table.column("id").to_pylist()]))
