"""Is a finetuning run bound by data or by compute? (run by hand; not part of the test suite)

1. Input pipeline: N COCO-sized JPEGs (640x480) stored as parquet bytes, read through the
   trainer's DataLoader (`training.data`: bytes -> decoded, resized to 224, centre-cropped,
   normalised tensors + tokenized captions) with 0/1/2 workers, against a bare loop that only
   decodes the same bytes with PIL (`Image.open(...).convert("RGB")`) in one process. Target:
   ratio >= 0.9 (the pipeline adds < 10 % over a bare decode).
2. Model: optimizer steps per second of the tiny CLIP (batch 32, InfoNCE, AdamW) on CPU.

Run: `python benchmarks/training.py [--images 512] [--workers 0 1 2]`
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from training.backends import PixelPipeline, load_backend  # noqa: E402
from training.data import PairBatchSampler, make_loader  # noqa: E402
from training.losses import clip_loss  # noqa: E402
from training.mixtures import ExampleSet  # noqa: E402

CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def jpeg_table(n: int, root: Path):
    """A parquet-backed table of n photo-like 640x480 JPEGs (smooth gradients + noise)."""
    from datasets import Dataset, Features, Image as ImageFeature, Value, load_dataset

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:480, 0:640]
    rows = []
    for i in range(n):
        base = (np.sin(xx / (40 + i % 17)) + np.cos(yy / (30 + i % 11))) * 60 + 128
        arr = np.stack([base, base[::-1], base[:, ::-1]], -1) + rng.normal(0, 12, (480, 640, 3))
        buf = io.BytesIO()
        Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
        rows.append(buf.getvalue())
    feats = Features({"image": ImageFeature(), "caption": Value("string")})
    Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in rows],
                       "caption": [f"a photo number {i}" for i in range(n)]}, features=feats
                      ).to_parquet(root / "train.parquet")
    table = load_dataset("parquet", data_files=str(root / "train.parquet"), split="train")
    return table.cast_column("image", ImageFeature(decode=False)), rows


def bare_decode(images: list[bytes]) -> float:
    start = time.perf_counter()
    for data in images:
        Image.open(io.BytesIO(data)).convert("RGB")
    return len(images) / (time.perf_counter() - start)


def pipeline(table, tokenize, workers: int, batch: int = 32) -> float:
    examples = ExampleSet(tables=[table])
    for i, caption in enumerate(table["caption"]):
        examples.add(0, i, "image", caption, None, -1, "real")
    backend = SimpleNamespace(pixels=PixelPipeline(224, CLIP_MEAN, CLIP_STD), tokenize=tokenize)
    sampler = PairBatchSampler([[i] for i in range(len(examples))], batch)
    loader = make_loader(examples, sampler, backend, workers)
    start = time.perf_counter()
    n = sum(len(b["pixel_values"]) for b in loader)  # worker start-up included, as in a run
    return n / (time.perf_counter() - start)


def model_steps(tiny_dir: Path | None, steps: int = 20, batch: int = 32) -> float:
    from builders.infra.models.profiles import tiny_profile

    backend = load_backend("transformers", tiny_profile(tiny_dir).clip)
    opt = torch.optim.AdamW(backend.module.parameters(), lr=1e-4)
    pixels = torch.randn(batch, 3, backend.image_size, backend.image_size)
    text = backend.tokenize([f"a photo number {i}" for i in range(batch)])
    start = None
    for step in range(steps + 2):
        if step == 2:  # the first steps allocate
            start = time.perf_counter()
        img, txt, _, scale = backend.module(pixel_values=pixels, text=text)
        clip_loss(img, txt, scale).backward()
        opt.step()
        opt.zero_grad()
    return steps / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--tiny-models-dir", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        table, raw = jpeg_table(args.images, Path(tmp))
        tokenize = load_backend("transformers", _tiny_clip(args.tiny_models_dir)).tokenize
        bare = bare_decode(raw)
        print(f"input: {args.images} JPEGs 640x480 ({sum(map(len, raw)) / 2**20:.1f} MiB of parquet bytes)")
        print(f"bare PIL decode, 1 process: {bare:8.1f} images/s")
        for w in args.workers:
            ours = pipeline(table, tokenize, w)
            print(f"trainer pipeline, {w} worker(s) (decode + 224 resize/crop/normalise + tokenize): "
                  f"{ours:8.1f} images/s  ratio to bare decode {ours / bare:.2f}")
    rate = model_steps(args.tiny_models_dir)
    print(f"tiny CLIP, batch 32, 1 thread: {rate:.1f} steps/s = {32 * rate:.0f} images/s "
          "(compare with the pipeline rate above to see which bounds a run)")


def _tiny_clip(tiny_dir: Path | None) -> str:
    from builders.infra.models.profiles import tiny_profile

    return tiny_profile(tiny_dir).clip


if __name__ == "__main__":
    main()
