"""The gallery's memory is bounded by a page plus a constant, whatever the split size (issue 25):
writing the gallery of a build 10x larger must not need more memory.

Measured with tracemalloc (the Python objects the rows become, image bytes included) plus the
Arrow pool's peak growth while writing, on builds far larger than a page whose rows carry ~60 kB
of incompressible image bytes each (so rows kept alive dominate any constant).

Each size is measured in a fresh interpreter (this file run as a script): in the pytest worker,
what earlier tests left behind counted too. A root logger left at DEBUG with pytest's capture
handler keeps a record per PNG chunk that PIL reads, so the larger split "grew" by the harness's
log, not the gallery's rows (CI, stop 39: 1.2 MB vs 16.7 MB).
"""

from __future__ import annotations

import gc
import io
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from builders.viewer.render import GalleryConfig, write_gallery
from builders.viewer.source import GallerySourceConfig, open_source

README = """---
configs:
- config_name: default
  data_files:
  - split: test
    path: data/test-*
---
"""
PAGE = 4


def _pngs(n: int, side: int = 144) -> list[bytes]:
    gen = np.random.default_rng(0)
    out = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(gen.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, "PNG")
        out.append(buf.getvalue())
    return out


def _build(root: Path, rows: int, images: list[bytes]) -> Path:
    """A build folder in the Hub layout: README `configs:` + a parquet shard written as the
    builders write theirs (HF features in the schema, row groups of 100)."""
    import datasets

    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "image": datasets.Image(),
            "caption": datasets.Value("string"),
            "score": datasets.Value("float64"),
        }
    )
    table = pa.Table.from_pylist(
        [
            {
                "id": str(i),
                "image": {"bytes": images[i % len(images)], "path": None},
                "caption": f"a photo number {i}",
                "score": i / rows,
            }
            for i in range(rows)
        ],
        schema=features.arrow_schema,
    )
    (root / "data").mkdir(parents=True)
    pq.write_table(table, root / "data" / "test-00000-of-00001.parquet", row_group_size=100)
    (root / "README.md").write_text(README)
    return root


def _gallery(build: Path, out: Path):
    return write_gallery(open_source(GallerySourceConfig(str(build))), GalleryConfig(output=out, page_size=PAGE))


def _peak_bytes(build: Path, out: Path) -> tuple[int, int]:
    """(tracemalloc peak + Arrow pool growth) while writing the gallery of `build`; its rows."""
    gc.collect()
    pool = pa.default_memory_pool()
    pool_before = pool.max_memory()
    tracemalloc.start()
    try:
        result = _gallery(build, out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # The pool's peak is process-wide and never reset: its growth bounds what this run added.
    return peak + max(0, pool.max_memory() - pool_before), result.rows


def _peak_in_fresh_process(warmup: Path, build: Path, out: Path) -> tuple[int, int]:
    """`_peak_bytes(build)` in a new interpreter, after one gallery of `warmup` there (lazy
    imports and caches are not the gallery's to carry)."""
    done = subprocess.run(
        [sys.executable, __file__, str(warmup), str(build), str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    peak, rows = json.loads(done.stdout.strip().splitlines()[-1])
    return peak, rows


@pytest.mark.slow
def test_gallery_memory_does_not_grow_with_the_split(tmp_path):
    images = _pngs(8)
    # Both splits hold whole row groups of 100 (as the builders write them): a row group is read
    # at once, so the bound is a row group's bytes plus a page of rows, whatever the split size.
    small = _build(tmp_path / "small", 100, images)
    large = _build(tmp_path / "large", 500, images)
    small_peak, small_rows = _peak_in_fresh_process(small, small, tmp_path / "g_small")
    large_peak, large_rows = _peak_in_fresh_process(small, large, tmp_path / "g_large")
    assert (small_rows, large_rows) == (100, 500)
    data_mb = 500 * len(images[0]) / 1e6
    # 500 rows hold ~31 MB of image bytes; a page of 4 rows holds ~0.25 MB.
    assert large_peak <= 1.3 * small_peak, (small_peak / 1e6, large_peak / 1e6, data_mb)
    assert json.loads((tmp_path / "g_large" / "gallery.json").read_text())["rows"] == 500


if __name__ == "__main__":  # the measurement of `_peak_in_fresh_process`
    warmup_build, measured_build, output = map(Path, sys.argv[1:4])
    _gallery(warmup_build, output.with_name(output.name + "-warmup"))
    print(json.dumps(_peak_bytes(measured_build, output)))
