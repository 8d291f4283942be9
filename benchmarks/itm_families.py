"""ITM pairs per second of each scored family on this machine's CPU, at the tiny shapes and at the
production shapes (run by hand; not part of the tests): the cost of a cross-encoder's ITM deltas
is pairs x forward passes (three a counterfactual pair), where a CLIP encodes each image and
caption once.

Tiny: each family's tiny random-init model (builders/models/tiny_families.py; the tiny CLIP of
the tiny profile) scores `--pairs` image-caption pairs. Production: each family at its published
size with random weights (builders/models/production_families.py: BLIP ITM base and large,
BridgeTower large ITM and ITC, ViLT B/32, FLAVA full ITM and contrastive; CLIP ViT-B/32 from builders/models/production_configs.py)
with its checkpoint's image processing (builders/devtools/doctor_families.py) scores
`--production-pairs` pairs (a few: seconds per pair on a CPU). Every cross-encoder goes through
the adapter the report uses (builders/models/cross_encoders.py: the model's own processor, then its ITM
head), `--batch` pairs a forward call; the CLIP rows encode the same images and captions and take
the cosines. Each row names the input size the model saw (pixels, tokens). Times are the best of
`--repeats` (the machine may be shared: two runs on this 2-core machine differed up to 30x).
Images are 640 x 480 (a COCO photo's size): each processor resizes them as it does a real one.

Run: `python benchmarks/itm_families.py [--pairs 256] [--production-pairs 4] [--batch 32]
[--repeats 3] [--no-production]`
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402


def images_and_captions(n: int) -> tuple[list, list[str]]:
    rng = np.random.default_rng(0)
    colours = ["red", "green", "blue", "yellow", "purple", "orange", "black", "white"]
    images = [Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)) for _ in range(n)]
    return images, [f"a {colours[i % len(colours)]} cube on a table" for i in range(n)]


def best_of(repeats: int, run, warm_up) -> float:
    """The fastest of `repeats` runs, after one `warm_up` call (a first forward call allocates
    and picks its kernels)."""
    warm_up()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def cross_encoder_rate(backend, args, images, captions) -> tuple[float, str]:
    """Pairs per second through the report's adapter, and the input size of one pair."""
    inputs = backend.inputs(images[:1], captions[:1])
    size = f"{'x'.join(map(str, inputs['pixel_values'].shape[-2:]))} px, {inputs['input_ids'].shape[-1]} tokens"

    def run():
        for s in range(0, len(images), args.batch):
            backend.score(images[s : s + args.batch], captions[s : s + args.batch])

    warm_up = lambda: backend.score(images[:1], captions[:1])  # noqa: E731
    return len(images) / best_of(args.repeats, run, warm_up), size


def clip_rate(backend, args, images, captions) -> tuple[float, str]:
    module = backend.module.eval()
    per_image = backend.pixels.per_image()

    @torch.no_grad()
    def run(n: int = len(images)):
        for s in range(0, n, args.batch):
            px = backend.pixels.per_batch(torch.stack([per_image(im) for im in images[s : min(s + args.batch, n)]]))
            img, txt, _, _ = module(pixel_values=px, text=backend.tokenize(captions[s : min(s + args.batch, n)]))
            (img * txt).sum(1)

    tokens = backend.tokenize(captions[:1])["input_ids"].shape[-1]
    rate = len(images) / best_of(args.repeats, run, lambda: run(1))
    return rate, f"{backend.pixels.size}x{backend.pixels.size} px, {tokens} tokens"


def tiny_rows(root: Path, args) -> None:
    from builders.models.clip_ids import parse_clip_id
    from builders.models.families import model_family
    from builders.models.tiny import build_tiny_models
    from builders.models.tiny_families import build_tiny_families
    from training.backends import load_backend
    from builders.models.cross_encoders import load_cross_encoder

    clip = build_tiny_models(root)["clip"]
    images, captions = images_and_captions(args.pairs)
    print(f"\ntiny shapes, {args.pairs} pairs, {args.batch} a call, {torch.get_num_threads()} threads")
    print(row("CLIPModel (cosine)", *clip_rate(load_backend(parse_clip_id(str(clip))), args, images, captions)))
    for folder in build_tiny_families(root / "families").values():
        head = model_family(str(folder)).architecture  # the head its config names, as --model reads it
        backend = load_cross_encoder(parse_clip_id(str(folder)), head)
        print(row(head, *cross_encoder_rate(backend, args, images, captions)))


def production_rows(root: Path, args) -> None:
    from builders.devtools.doctor_families import FAMILY_ROWS, cross_encoder
    from builders.models.clip_ids import ClipId
    from builders.models.production_configs import ARCHS, build_random
    from training.backends import Backend, HFClip, HFTokenize, transformers_pixels
    from transformers import CLIPImageProcessor

    from builders.models.loaders import load_clip
    from builders.models.tiny import build_tiny_models

    n = args.production_pairs
    images, captions = images_and_captions(n)
    print(f"\nproduction shapes (random weights), {n} pairs, {args.batch} a call, {torch.get_num_threads()} threads")
    _, tiny_processor = load_clip(str(build_tiny_models(root)["clip"]))
    clip = Backend(
        ClipId("transformers", "clip", "clip"),
        HFClip(build_random(ARCHS["clip"])),
        transformers_pixels(CLIPImageProcessor()),
        HFTokenize(tiny_processor.tokenizer),
        None,
    )
    print(row("CLIP ViT-B/32 (cosine)", *clip_rate(clip, args, images, captions)))
    del clip
    for family in FAMILY_ROWS:
        backend = cross_encoder(family.arch, root, production=True, device="cpu")
        print(row(family.models, *cross_encoder_rate(backend, args, images, captions)))
        del backend  # one model in memory at a time (BridgeTower large: 3.5 GB)


def row(name: str, rate: float, size: str) -> str:
    return f"{name:38s} {rate:10.2f}  {size}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=256, help="pairs at the tiny shapes")
    parser.add_argument("--production-pairs", type=int, default=4, help="pairs at the production shapes")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-production", action="store_true", help="the tiny shapes only")
    parser.add_argument("--tiny-dir", type=Path, default=None, help="tiny models folder (default: a temporary one)")
    args = parser.parse_args()
    root = args.tiny_dir or Path(tempfile.mkdtemp(prefix="itm-families-"))
    print(f"ITM pairs/s on this CPU ({'model':38s} pairs/s  input of a pair)")
    tiny_rows(root, args)
    if not args.no_production:
        production_rows(root, args)


if __name__ == "__main__":
    main()
