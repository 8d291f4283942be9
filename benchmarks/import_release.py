"""Importing the published COCO-Counterfactuals images (`build coco-counterfactuals --captions-from
PAIRS --images-from images.zip`): pairs per second and peak memory at two release sizes, and the
time to import the release's 17,410 pairs extrapolated from the measured rates.

A synthetic release is written in the Hub release's layout: the published .jsonl keys and a zip
of `images/{id}_img_{0,1}.jpg`, 512x512 JPEGs like the release's (smooth colour fields with
grain; the release holds 6.36 GB / 34,820 = 183 kB per image). Each build runs in a fresh
process (its peak RSS, ru_maxrss, is the build's alone), through the command line, twice per
mode at two sizes; time = fixed + per-pair x pairs is fitted through the two, so process start
and model loading do not count against the rate:
1. `--no-clip-scores`: everything but the model (reading the zip in place, checking and storing
   the bytes, the zip's sha256, writing parquet, the card);
2. the CLIP filter's scores with CLIP ViT-L/14 at its real size (random weights,
   `builders.models.production_configs`: the real compute, no download), on `--device`.
Memory must not grow with the number of pairs (target: peak RSS ratio <= 1.3 between the sizes).
3. A hostile zip (issue 41): the same pairs with each image padded by 120 MiB of zeros (a zip of
   a few MB, deflated), unscored, against the clean zip of those pairs: each member is over
   `--max-image-bytes` and counted unread, so the peak RSS must not grow (target: ratio <= 1.3;
   before the bound, 8 such members asked pyarrow for a 587 MB buffer).
Run: `python benchmarks/import_release.py [--pairs 256 2048] [--scored-pairs 16 48]
[--padded-pairs 8] [--device cpu|cuda] [--keep DIR]`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: The release: 17,410 image pairs (Le et al. 2023 §3.3), an images.zip of 6.36 GB.
RELEASE_PAIRS = 17_410
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
#: Distinct JPEGs in the pool the zip's members are drawn from (decoding and CLIP cost the same
#: whatever the content; distinct bytes keep the zip from being trivially small).
POOL = 48


def _jpeg(seed: int, size: int = 512) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    base = np.stack(
        [(np.sin(6 * x * rng.random() + 3 * y * rng.random() + c) + 1) * 110 for c in rng.random(3) * 6], -1
    )
    pixels = base + rng.normal(0, 20, (size, size, 3))
    buf = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def synthetic_release(root: Path, pairs: int, pad: int = 0) -> tuple[Path, Path, float]:
    """(pairs .jsonl, images.zip, mean bytes per image) of `pairs` pairs; `pad` zero bytes after
    each image (deflated: the zip stays small)."""
    root.mkdir(parents=True, exist_ok=True)
    pool = [_jpeg(seed) for seed in range(POOL)]
    jsonl, zpath = root / "examples.jsonl", root / "images.zip"
    compression = zipfile.ZIP_DEFLATED if pad else zipfile.ZIP_STORED
    with open(jsonl, "w") as f, zipfile.ZipFile(zpath, "w", compression) as zf:
        for i in range(pairs):
            old, new = WORDS[i % len(WORDS)], WORDS[(i * 7 + 3) % len(WORDS)]
            new = new if new != old else WORDS[(i + 1) % len(WORDS)]
            row_id = f"{100000 + i}_{i % 5}"
            f.write(
                json.dumps(
                    {
                        "coco-counterfactual-index": row_id,
                        "original_caption": f"A photo of a {old} on the grass.",
                        "counterfactual_caption": f"A photo of a {new} on the grass.",
                    }
                )
                + "\n"
            )
            for n in (0, 1):
                with zf.open(f"images/{row_id}_img_{n}.jpg", "w", force_zip64=pad > 0) as member:
                    member.write(pool[(2 * i + n) % POOL])
                    _write_zeros(member, pad)
    return jsonl, zpath, sum(map(len, pool)) / POOL + pad


def _write_zeros(f, n: int) -> None:
    """`n` zero bytes, 1 MiB at a time: this process never holds a padded image (a child's peak
    RSS, ru_maxrss, starts from its parent's at the fork)."""
    chunk = bytes(1 << 20)
    while n > 0:
        f.write(chunk[: min(n, len(chunk))])
        n -= len(chunk)


def production_clip(folder: Path) -> Path:
    """CLIP ViT-L/14 at its real size with random weights, saved as safetensors with CLIP's own
    image processing (224 px) and the tiny profile's CLIP tokenizer."""
    from transformers import CLIPImageProcessor, CLIPProcessor

    from builders.models.loaders import load_clip
    from builders.models.production_configs import ARCHS, build_random
    from builders.models.profiles import resolve_profile

    if not (folder / "model.safetensors").is_file():
        build_random(ARCHS["clip_filter"]).save_pretrained(folder, safe_serialization=True)
        _, tiny = load_clip(resolve_profile("tiny").clip_filter, "cpu")
        CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=tiny.tokenizer).save_pretrained(folder)
    return folder


def build_once(argv: list[str]) -> dict:
    """One import build in this process, through the command line: wall time and peak RSS."""
    from builders.app.cli import main as cli_main

    t0 = time.perf_counter()
    assert cli_main(argv) == 0
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        / (1e6 if sys.platform == "darwin" else 1024),
    }


def measure(work: Path, pairs: int, clip: Path | None, device: str, pad: int = 0) -> dict:
    """One import build of `pairs` pairs in a fresh process: scored by `clip`, or not at all;
    with `pad`, every image is over --max-image-bytes and no pair is kept."""
    jsonl, zpath, image_bytes = synthetic_release(work / f"release-{pairs}-{pad}", pairs, pad)
    out = work / f"out-{pairs}-{pad}-{'vitl14' if clip else 'unscored'}"
    shutil.rmtree(out, ignore_errors=True)
    argv = [
        "build",
        "coco-counterfactuals",
        "--captions-from",
        str(jsonl),
        "--images-from",
        str(zpath),
        "--output",
        str(out),
        "--models",
        "tiny",
        "--device",
        device,
        *(["--clip-filter-model", str(clip)] if clip else ["--no-clip-scores"]),
        *(["--max-error-fraction", "1"] if pad else []),
    ]
    env = dict(os.environ)
    if (REPO / ".nltk_data").is_dir():  # the captions' word comparison tokenizes with NLTK
        env.setdefault("NLTK_DATA", str(REPO / ".nltk_data"))
    child = subprocess.run(
        [sys.executable, __file__, "--build-once", json.dumps(argv)],
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    result = json.loads(child.stdout.strip().splitlines()[-1])
    rows = json.loads((out / "build_manifest.json").read_text())["outputs"]["default/test"]["rows"]
    assert rows == (0 if pad else pairs), (rows, pairs)
    return {**result, "pairs": pairs, "zip_mb": zpath.stat().st_size / 1e6, "image_kb": image_bytes / 1e3}


def fit(small: dict, large: dict) -> tuple[float, float]:
    """(fixed seconds, seconds per pair) of the line through the two builds."""
    per_pair = (large["wall_s"] - small["wall_s"]) / (large["pairs"] - small["pairs"])
    return small["wall_s"] - per_pair * small["pairs"], per_pair


def report(name: str, small: dict, large: dict) -> None:
    for r in (small, large):
        print(
            f"{name}: {r['pairs']} pairs ({2 * r['pairs']} 512x512 JPEGs of {r['image_kb']:.0f} kB, "
            f"zip {r['zip_mb']:.0f} MB): {r['wall_s']:.1f} s wall, peak RSS {r['peak_rss_mb']:.0f} MB"
        )
    fixed, per_pair = fit(small, large)
    release = fixed + per_pair * RELEASE_PAIRS
    print(
        f"{name}: {1 / per_pair:.1f} pairs/s past a fixed {fixed:.0f} s; peak RSS ratio "
        f"{large['peak_rss_mb'] / small['peak_rss_mb']:.2f}x from {small['pairs']} to {large['pairs']} "
        f"pairs (target <= 1.3); extrapolated: the release's {RELEASE_PAIRS:,} pairs in "
        f"{release / 60:.1f} min"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--pairs",
        type=int,
        nargs=2,
        default=[256, 2048],
        metavar=("SMALL", "LARGE"),
        help="pairs of the two unscored imports",
    )
    parser.add_argument(
        "--scored-pairs",
        type=int,
        nargs=2,
        default=[16, 48],
        metavar=("SMALL", "LARGE"),
        help="pairs of the two imports scored with CLIP ViT-L/14 (0 0: skip)",
    )
    parser.add_argument(
        "--padded-pairs", type=int, default=8, help="pairs of the hostile zip, clean and padded (0: skip)"
    )
    parser.add_argument("--device", default="cpu", help="where CLIP runs (cpu, cuda)")
    parser.add_argument("--keep", type=Path, default=None, help="write the releases and builds here")
    parser.add_argument("--build-once", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_once:
        print(json.dumps(build_once(json.loads(args.build_once))))
        return

    work = args.keep or Path(tempfile.mkdtemp(prefix="import-bench-"))
    try:
        unscored = [measure(work, n, None, args.device) for n in args.pairs]
        clip = production_clip(work / "clip-vit-l-14") if any(args.scored_pairs) else None
        scored = [measure(work, n, clip, args.device) for n in args.scored_pairs] if clip else []
        n = args.padded_pairs
        padded = [measure(work, n, None, args.device, pad) for pad in (0, 120 << 20)] if n else []
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    import torch

    print(
        f"CPU: {os.cpu_count()} cores visible, torch {torch.get_num_threads()} threads; CLIP on "
        f"{args.device}" + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else "")
    )
    report("unscored (--no-clip-scores)", *unscored)
    if scored:
        report("scored (CLIP ViT-L/14, real size)", *scored)
    if padded:
        clean, hostile = padded
        print(
            f"padded: {hostile['pairs']} pairs of images + 120 MiB of zeros (zip {hostile['zip_mb']:.1f} MB): "
            f"peak RSS {hostile['peak_rss_mb']:.0f} MB against {clean['peak_rss_mb']:.0f} MB for the clean "
            f"zip, ratio {hostile['peak_rss_mb'] / clean['peak_rss_mb']:.2f}x (target <= 1.3)"
        )


if __name__ == "__main__":
    main()
