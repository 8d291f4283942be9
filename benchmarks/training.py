"""Is a finetuning run bound by data or by compute? (run by hand; not part of the test suite)

0. Storage: the same N JPEGs stored as builds store a real image (`loading_scripts.images`: its
   bytes as read) and as builds stored it before issue #34 (re-encoded as PNG), each written as a
   parquet part by the builders' writer: shard bytes and their ratio to the input JPEGs' bytes,
   full-size decode images/s, and draft-mode (`--fast-decode`, JPEG only) decode images/s.
1. Input pipeline: N COCO-sized JPEGs (640x480) stored as parquet bytes, read through the
   trainer's DataLoader (`training.data`: bytes -> JPEG decoded at full size (the default, equal
   to CLIPImageProcessor) or in draft mode at a reduced scale (`--fast-decode`), resized to 224,
   centre-cropped, normalised + tokenized captions) with 0/1/2 workers, against the same work done
   the plainest way: one process, a loop over the same bytes in memory that decodes, resizes,
   crops, normalises uint8 -> float with numpy and tokenizes each batch of 32 captions (its output
   is checked equal to the pipeline's first). Target: ratio >= 0.9 (the DataLoader machinery costs
   < 10 %). The cost/benefit of `--fast-decode`: its images/s against the default's, and its mean
   and max distance to CLIPImageProcessor's pixels in grey levels. A full-size PIL decode loop
   (no resize) is printed as a reference: the part of the work that draft mode shrinks.
2. Model: optimizer steps per second of the tiny CLIP (batch 32, InfoNCE, AdamW) on CPU.

Rates are the best of `--repeats` passes (the machine may be shared). Run:
`python benchmarks/training.py [--images 512] [--workers 0 1 2] [--repeats 3]`
"""

from __future__ import annotations

import argparse
import io
import os
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

from builders.models.clip_ids import parse_clip_id  # noqa: E402
from training.backends import load_backend, transformers_pixels  # noqa: E402
from training.data import PairBatchSampler, fixed_batches, make_loader  # noqa: E402
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
    Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in rows], "caption": [f"a photo number {i}" for i in range(n)]},
        features=feats,
    ).to_parquet(root / "train.parquet")
    table = load_dataset("parquet", data_files=str(root / "train.parquet"), split="train")
    return table.cast_column("image", ImageFeature(decode=False)), rows


def full_decode(images: list[bytes], draft: int | None = None) -> float:
    """Reference only: full-size decode (or draft mode at >= `draft` px a side, as
    `--fast-decode`: JPEG only), none of the pipeline's other work."""
    start = time.perf_counter()
    for data in images:
        img = Image.open(io.BytesIO(data))
        if draft and img.format == "JPEG":
            img.draft("RGB", (draft, draft))
        img.convert("RGB")
    return len(images) / (time.perf_counter() - start)


def storage(raw: list[bytes], root: Path, best) -> None:
    """Shard bytes and decode rates of the images stored as read against re-encoded as PNG."""
    from datasets import Features, Image as ImageFeature

    from builders.engine.no_follow import RootDir
    from builders.engine.sharding.part_writer import rows_to_table, write_parquet
    from loading_scripts.images import CheckedImage, check_image

    stored: dict[str, list[dict]] = {"as read (now)": [], "re-encoded PNG (before)": []}
    for data in raw:
        checked = check_image(data)
        assert checked.as_read == data, "a test JPEG would not be stored as read"
        stored["as read (now)"].append(checked.cell())
        # What builds stored before: datasets' PNG of the decoded pixels.
        stored["re-encoded PNG (before)"].append(CheckedImage(checked.pixels, None).cell())
    features = Features({"image": ImageFeature()})
    given = sum(map(len, raw))
    for n, (name, cells) in enumerate(stored.items()):
        table = rows_to_table([{"image": c} for c in cells], features)
        with RootDir(root, create=True) as out:
            shard = write_parquet(out, f"storage-{n}.parquet", table)["bytes"]
        images = [c["bytes"] for c in cells]
        fast = f"{best(lambda: full_decode(images, 224)):7.1f} images/s" if n == 0 else "does not apply (PNG)"
        print(
            f"stored {name}: shard {shard / 2**20:6.1f} MiB = {shard / given:.2f}x the input "
            f"JPEGs; decode full {best(lambda: full_decode(images)):7.1f} images/s, "
            f"--fast-decode {fast}"
        )


def bare_batches(images: list[bytes], captions: list[str], tokenize, size: int, batch: int = 32, draft: bool = False):
    """The pipeline's work in a plain loop: per batch, normalised float pixels and tokens."""
    mean = np.array(CLIP_MEAN, np.float32).reshape(1, 3, 1, 1)
    std = np.array(CLIP_STD, np.float32).reshape(1, 3, 1, 1)
    for b in range(0, len(images) - batch + 1, batch):  # full batches, as the sampler
        crops = []
        for data in images[b : b + batch]:
            img = Image.open(io.BytesIO(data))
            if draft:
                img.draft("RGB", (size, size))
            img = img.convert("RGB")
            w, h = img.size
            # Short side to `size` (long side truncated, as torchvision's Resize), bicubic.
            img = img.resize(
                (size, int(size * h / w)) if w <= h else (int(size * w / h), size), Image.Resampling.BICUBIC
            )
            left, top = (img.width - size) // 2, (img.height - size) // 2  # transformers' offsets
            crops.append(np.asarray(img.crop((left, top, left + size, top + size))))
        pixels = (np.stack(crops).transpose(0, 3, 1, 2).astype(np.float32) / 255 - mean) / std
        yield pixels, tokenize(captions[b : b + batch])


def bare_loop(images: list[bytes], captions: list[str], tokenize, size: int, draft: bool) -> float:
    start = time.perf_counter()
    n = sum(len(pixels) for pixels, _ in bare_batches(images, captions, tokenize, size, draft=draft))
    return n / (time.perf_counter() - start)


def examples_of(table) -> ExampleSet:
    examples = ExampleSet(tables=[table])
    for i, caption in enumerate(table["caption"]):
        examples.add(0, i, "image", caption, None, -1, "real")
    return examples


def pixel_backend(tokenize) -> SimpleNamespace:
    from transformers import CLIPImageProcessor

    return SimpleNamespace(pixels=transformers_pixels(CLIPImageProcessor()), tokenize=tokenize)


def check_same_work(table, raw: list[bytes], tokenize, fast: bool) -> np.ndarray:
    """The bare loop's first batch equals the pipeline's (same bytes, in order); returns it."""
    loader = make_loader(examples_of(table), fixed_batches(32, 32), pixel_backend(tokenize), 0, fast_decode=fast)
    ours = next(iter(loader))["pixel_values"].numpy()
    bare, _ = next(bare_batches(raw, table["caption"], tokenize, 224, draft=fast))
    np.testing.assert_allclose(bare, ours, atol=1e-5)
    return ours


def grey_levels_to_reference(raw: list[bytes], pixels: np.ndarray) -> tuple[float, float]:
    """Mean and max |pixels - CLIPImageProcessor's| over the first batch, in 0..255 grey levels."""
    from transformers import CLIPImageProcessor

    processor = CLIPImageProcessor()
    ref = np.stack(
        [processor(Image.open(io.BytesIO(b)), return_tensors="np")["pixel_values"][0] for b in raw[: len(pixels)]]
    )
    diff = np.abs(pixels - ref) * np.array(CLIP_STD).reshape(1, 3, 1, 1) * 255
    return float(diff.mean()), float(diff.max())


def pipeline(table, tokenize, workers: int, fast: bool, batch: int = 32) -> float:
    examples = examples_of(table)
    sampler = PairBatchSampler([[i] for i in range(len(examples))], batch)
    loader = make_loader(examples, sampler, pixel_backend(tokenize), workers, fast_decode=fast)
    start = time.perf_counter()
    n = sum(len(b["pixel_values"]) for b in loader)  # worker start-up included, as in a run
    return n / (time.perf_counter() - start)


def model_steps(tiny_dir: Path | None, steps: int = 20, batch: int = 32) -> float:
    from builders.models.profiles import tiny_profile

    backend = load_backend(parse_clip_id(tiny_profile(tiny_dir).clip, "transformers"))
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
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tiny-models-dir", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    best = lambda measure: max(measure() for _ in range(args.repeats))  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        table, raw = jpeg_table(args.images, Path(tmp))
        captions = table["caption"]
        tokenize = load_backend(parse_clip_id(_tiny_clip(args.tiny_models_dir), "transformers")).tokenize
        print(
            f"input: {args.images} JPEGs 640x480 ({sum(map(len, raw)) / 2**20:.1f} MiB of parquet bytes), "
            f"batch 32, best of {args.repeats}, {os.cpu_count()} CPU(s), torch 1 thread"
        )
        storage(raw, Path(tmp), best)
        print(f"reference: full-size PIL decode only, 1 process: {best(lambda: full_decode(raw)):8.1f} images/s")
        rates = {}
        for fast, name in ((False, "default (full decode)"), (True, "--fast-decode (draft)")):
            mean, worst = grey_levels_to_reference(raw, check_same_work(table, raw, tokenize, fast))
            bare = best(lambda: bare_loop(raw, captions, tokenize, 224, fast))
            print(
                f"{name}: vs CLIPImageProcessor mean {mean:.3f} / max {worst:.0f} grey levels; "
                f"bare loop, 1 process: {bare:8.1f} images/s"
            )
            for w in args.workers:
                rates[fast, w] = best(lambda: pipeline(table, tokenize, w, fast))
                print(
                    f"  trainer pipeline, {w} worker(s): {rates[fast, w]:8.1f} images/s  ratio to "
                    f"the bare loop {rates[fast, w] / bare:.2f} (target >= 0.9)"
                )
        for w in args.workers:
            print(f"--fast-decode speed-up, {w} worker(s): {rates[True, w] / rates[False, w]:.2f}x")
    rate = model_steps(args.tiny_models_dir)
    print(
        f"tiny CLIP, batch 32, 1 thread: {rate:.1f} steps/s = {32 * rate:.0f} images/s "
        "(compare with the pipeline rate above to see which bounds a run)"
    )


def _tiny_clip(tiny_dir: Path | None) -> str:
    from builders.models.profiles import tiny_profile

    return tiny_profile(tiny_dir).clip


if __name__ == "__main__":
    main()
