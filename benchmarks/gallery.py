"""`counterfactory show` on a synthetic COCO-Counterfactuals-layout build: peak memory at two split
sizes, CPU seconds per 100 rows and the bytes a browser loads for the first page.

The build is written in the Hub layout the builders write (README `configs:` + one parquet shard
in row groups of 100, and a manifest naming the counterfactuals' row view) with 256x256 PNG image
pairs, so only the gallery is measured, not a generator. Each size's gallery is written in a fresh
process, whose peak RSS (ru_maxrss) is the gallery's alone. Targets: peak RSS flat from the small
to the large size (ratio <= 1.3, issue 25: memory bounded by a page, whatever the split size);
under 1 CPU second per 100 rows and a first page under 1 MB at any size (issue 15).
Run: `python benchmarks/gallery.py [--rows 2000 20000] [--keep DIR]` (the temporary folder,
several GB at 20,000 rows, is removed at the end unless --keep).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = [
    "dog",
    "cat",
    "horse",
    "pizza",
    "frisbee",
    "car",
    "bus",
    "train",
    "man",
    "woman",
    "kite",
    "surfboard",
    "table",
    "bench",
    "umbrella",
    "giraffe",
    "zebra",
    "clock",
    "boat",
    "bird",
]
README = """---
configs:
- config_name: default
  data_files:
  - split: test
    path: data/test-*
---
# synthetic counterfactuals ({rows} rows)
"""


def _png(rng: random.Random, size: int = 256) -> bytes:
    import numpy as np
    from PIL import Image

    gen = np.random.default_rng(rng.randrange(2**32))
    base = np.linspace(0, 255, size, dtype=np.float32)[None, :, None] * gen.random(3, dtype=np.float32)
    pixels = base + gen.normal(0, 25, (size, size, 3))
    buf = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def synthetic_build(root: Path, rows: int, seed: int = 0) -> Path:
    """Written a row group at a time, so a large build does not need its size in memory."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    from builders.counterfactuals.view import PAIR_VIEW
    from builders.engine.sharding.part_writer import ROW_GROUP_ROWS  # as the builders write

    rng = random.Random(seed)
    images = [_png(rng) for _ in range(64)]  # reused: the gallery decodes each row's anyway

    def row(i: int) -> dict:
        old, new = rng.sample(WORDS, 2)
        prefix = f"A photo number {i} of a "
        return {
            "id": f"{i}_0",
            "image_0": {"bytes": images[(2 * i) % 64], "path": None},
            "image_1": {"bytes": images[(2 * i + 1) % 64], "path": None},
            "caption_0": f"{prefix}{old} on the grass.",
            "caption_1": f"{prefix}{new} on the grass.",
            "replaced_word": old,
            "replacement_word": new,
            "replaced_position": len(prefix),
            "similarity": rng.uniform(0.8, 0.91),
            "perplexity": rng.uniform(20, 200),
            "p": 0.5,
            "guidance_scale": 7.5,
            "clip_score_0": rng.uniform(0.2, 0.35),
            "clip_score_1": rng.uniform(0.2, 0.35),
            "image_candidates_tried": 4,
            "image_candidates_passed": rng.randint(1, 4),
        }

    s, f = datasets.Value("string"), datasets.Value("float64")
    features = datasets.Features(
        {
            "id": s,
            "image_0": datasets.Image(),
            "image_1": datasets.Image(),
            "caption_0": s,
            "caption_1": s,
            "replaced_word": s,
            "replacement_word": s,
            "replaced_position": datasets.Value("int32"),
            "similarity": f,
            "perplexity": f,
            "p": f,
            "guidance_scale": f,
            "clip_score_0": f,
            "clip_score_1": f,
            "image_candidates_tried": datasets.Value("int32"),
            "image_candidates_passed": datasets.Value("int32"),
        }
    )
    (root / "data").mkdir(parents=True, exist_ok=True)
    path = root / "data" / "test-00000-of-00001.parquet"
    with pq.ParquetWriter(path, features.arrow_schema) as writer:
        for start in range(0, rows, ROW_GROUP_ROWS):
            group = [row(i) for i in range(start, min(rows, start + ROW_GROUP_ROWS))]
            writer.write_table(pa.Table.from_pylist(group, schema=features.arrow_schema))
    (root / "README.md").write_text(README.format(rows=rows))
    # The gallery shows a table as its manifest's view says (without one: the generic view).
    manifest = {"outputs": {"default/test": {"view": PAIR_VIEW.to_dict()}}}
    (root / "build_manifest.json").write_text(json.dumps(manifest))
    return root


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def show_once(build: Path, output: Path, page_size: int) -> dict:
    """Write the gallery of `build` in this process; its numbers (run in a fresh process)."""
    from builders.viewer.render import GalleryConfig, write_gallery
    from builders.viewer.source import GallerySourceConfig, open_source

    cpu0, wall0 = cpu(), time.perf_counter()
    source = open_source(GallerySourceConfig(str(build)))
    cpu1 = cpu()
    result = write_gallery(source, GalleryConfig(output=output, page_size=page_size))
    cpu2, wall2 = cpu(), time.perf_counter()
    return {
        "rows": result.rows,
        "pages": result.pages,
        "open_cpu_s": cpu1 - cpu0,
        "gallery_cpu_s": cpu2 - cpu1,
        "wall_s": wall2 - wall0,
        "first_page_bytes": result.first_page_bytes,
        # Linux reports KiB, macOS bytes.
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        / (1e6 if sys.platform == "darwin" else 1024),
    }


def measure(work: Path, rows: int, page_size: int) -> dict:
    build = synthetic_build(work / f"build-{rows}", rows)
    child = subprocess.run(
        [
            sys.executable,
            __file__,
            "--show-once",
            str(build),
            str(work / f"gallery-{rows}"),
            "--page-size",
            str(page_size),
        ],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs=2, default=[2000, 20000], metavar=("SMALL", "LARGE"))
    parser.add_argument("--page-size", type=int, default=24)
    parser.add_argument("--keep", type=Path, default=None, help="write the builds + galleries here")
    parser.add_argument("--show-once", nargs=2, type=Path, metavar=("BUILD", "OUTPUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.show_once:
        print(json.dumps(show_once(*args.show_once, args.page_size)))
        return

    work = args.keep or Path(tempfile.mkdtemp(prefix="gallery-bench-"))
    try:
        results = [measure(work, rows, args.page_size) for rows in args.rows]
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    for r in results:
        per100 = (r["open_cpu_s"] + r["gallery_cpu_s"]) / r["rows"] * 100
        print(
            f"rows: {r['rows']} ({2 * r['rows']} images of 256x256), pages: {r['pages']} of "
            f"{args.page_size}; open {r['open_cpu_s']:.2f} CPU s, gallery {r['gallery_cpu_s']:.2f} "
            f"CPU s, wall {r['wall_s']:.1f} s; {per100:.3f} CPU s per 100 rows (target < 1); first "
            f"page {r['first_page_bytes'] / 1e6:.3f} MB (target < 1 MB); peak RSS "
            f"{r['peak_rss_mb']:.0f} MB"
        )
    small, large = results
    print(
        f"ratio: peak RSS {large['peak_rss_mb'] / small['peak_rss_mb']:.2f}x from {small['rows']} to "
        f"{large['rows']} rows (target <= 1.3)"
    )


if __name__ == "__main__":
    main()
