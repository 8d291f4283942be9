"""`counterfactory show` on a synthetic COCO-Counterfactuals-layout build: CPU seconds per 100 rows
and the bytes a browser loads for the first page (HTML, CSS, JS, page data, every thumbnail).

The build is written in the Hub layout the builders write (README `configs:` + one parquet shard,
and a manifest naming the counterfactuals' row view) with 256x256 PNG image pairs, so only the
gallery is measured, not a generator. Targets (issue
#15): under 1 CPU second per 100 rows, a first page under 1 MB at any size (try --rows 20000).
Run: `python benchmarks/gallery.py [--rows 2000] [--keep DIR]`.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = ["dog", "cat", "horse", "pizza", "frisbee", "car", "bus", "train", "man", "woman", "kite",
         "surfboard", "table", "bench", "umbrella", "giraffe", "zebra", "clock", "boat", "bird"]
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
    import datasets

    rng = random.Random(seed)
    images = [_png(rng) for _ in range(64)]  # reused: the gallery decodes each row's anyway

    from builders.counterfactuals.view import PAIR_VIEW

    def gen():
        for i in range(rows):
            old, new = rng.sample(WORDS, 2)
            prefix = f"A photo number {i} of a "
            yield {"id": f"{i}_0", "image_0": {"bytes": images[(2 * i) % 64], "path": None},
                   "image_1": {"bytes": images[(2 * i + 1) % 64], "path": None},
                   "caption_0": f"{prefix}{old} on the grass.", "caption_1": f"{prefix}{new} on the grass.",
                   "replaced_word": old, "replacement_word": new, "replaced_position": len(prefix),
                   "similarity": rng.uniform(0.8, 0.91), "perplexity": rng.uniform(20, 200),
                   "p": 0.5, "guidance_scale": 7.5, "clip_score_0": rng.uniform(0.2, 0.35),
                   "clip_score_1": rng.uniform(0.2, 0.35), "image_candidates_tried": 4,
                   "image_candidates_passed": rng.randint(1, 4)}

    s, f = datasets.Value("string"), datasets.Value("float64")
    features = datasets.Features({
        "id": s, "image_0": datasets.Image(), "image_1": datasets.Image(), "caption_0": s,
        "caption_1": s, "replaced_word": s, "replacement_word": s,
        "replaced_position": datasets.Value("int32"), "similarity": f, "perplexity": f, "p": f,
        "guidance_scale": f, "clip_score_0": f, "clip_score_1": f,
        "image_candidates_tried": datasets.Value("int32"), "image_candidates_passed": datasets.Value("int32")})
    ds = datasets.Dataset.from_generator(gen, features=features, cache_dir=str(root / ".hf_cache"))
    (root / "data").mkdir(parents=True, exist_ok=True)
    ds.to_parquet(str(root / "data" / "test-00000-of-00001.parquet"))
    (root / "README.md").write_text(README.format(rows=rows))
    # The gallery shows a table as its manifest's view says (without one: the generic view).
    manifest = {"outputs": {"default/test": {"view": PAIR_VIEW.to_dict()}}}
    (root / "build_manifest.json").write_text(json.dumps(manifest))
    return root


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--page-size", type=int, default=24)
    parser.add_argument("--keep", type=Path, default=None, help="write build + gallery here")
    args = parser.parse_args()

    from builders.viewer.render import GalleryConfig, write_gallery
    from builders.viewer.source import GallerySourceConfig, open_source

    work = args.keep or Path(tempfile.mkdtemp(prefix="gallery-bench-"))
    build = synthetic_build(work / "build", args.rows)
    cpu0, wall0 = cpu(), time.perf_counter()
    source = open_source(GallerySourceConfig(str(build)))
    cpu1 = cpu()
    result = write_gallery(source, GalleryConfig(output=work / "gallery", page_size=args.page_size))
    cpu2, wall2 = cpu(), time.perf_counter()
    per100 = (cpu2 - cpu0) / result.rows * 100
    print(f"rows: {result.rows} ({2 * result.rows} images of 256x256), pages: {result.pages} of {args.page_size}")
    print(f"load_dataset: {cpu1 - cpu0:.2f} CPU s; gallery: {cpu2 - cpu1:.2f} CPU s; wall {wall2 - wall0:.1f} s")
    print(f"CPU seconds per 100 rows: {per100:.3f} (target < 1)")
    print(f"first page: {result.first_page_bytes / 1e6:.3f} MB for {min(args.page_size, result.rows)} rows "
          f"(target < 1 MB)")
    print(f"ratio: {per100:.3f} CPU s per 100 rows at {result.rows} rows; first page "
          f"{result.first_page_bytes / 1e6:.3f} MB")


if __name__ == "__main__":
    main()
