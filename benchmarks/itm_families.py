"""ITM pairs per second of each scored family at the tiny shapes, on this machine's CPU (run by
hand; not part of the tests): the cost of a cross-encoder's ITM deltas is pairs x forward passes
(three a counterfactual pair), where a CLIP encodes each image and caption once.

Each family's tiny random-init model (builders/models/tiny_families.py; the tiny CLIP of the
tiny profile) scores `--pairs` image-caption pairs through the adapter the report uses
(training/cross_encoders.py: the model's own processor, then its ITM head), `--batch` pairs a
forward call; the CLIP row encodes the same images and captions and takes the cosines. Times are
the best of `--repeats` (the machine may be shared). Production shapes are not timed here: they
need their published configs (`counterfactory doctor` does not build these families yet, #51).

Run: `python benchmarks/itm_families.py [--pairs 256] [--batch 32] [--repeats 3]`
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
    images = [Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)) for _ in range(n)]
    return images, [f"a {colours[i % len(colours)]} cube on a table" for i in range(n)]


def best_of(repeats: int, run) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def cross_encoder_rate(folder: Path, architecture: str, args, images, captions) -> float:
    from builders.models.clip_ids import parse_clip_id
    from training.cross_encoders import load_cross_encoder

    backend = load_cross_encoder(parse_clip_id(str(folder)), architecture)

    def run():
        for s in range(0, len(images), args.batch):
            backend.score(images[s : s + args.batch], captions[s : s + args.batch])

    return len(images) / best_of(args.repeats, run)


def clip_rate(folder: Path, args, images, captions) -> float:
    from builders.models.clip_ids import parse_clip_id
    from training.backends import load_backend

    backend = load_backend(parse_clip_id(str(folder)))
    module = backend.module.eval()
    per_image = backend.pixels.per_image()

    @torch.no_grad()
    def run():
        for s in range(0, len(images), args.batch):
            px = backend.pixels.per_batch(torch.stack([per_image(im) for im in images[s : s + args.batch]]))
            img, txt, _, _ = module(pixel_values=px, text=backend.tokenize(captions[s : s + args.batch]))
            (img * txt).sum(1)

    return len(images) / best_of(args.repeats, run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny-dir", type=Path, default=None, help="tiny models folder (default: a temporary one)")
    args = parser.parse_args()
    from builders.models.tiny import build_tiny_models
    from builders.models.tiny_families import build_tiny_families
    from builders.models.families import model_family

    root = args.tiny_dir or Path(tempfile.mkdtemp(prefix="itm-families-"))
    clip = build_tiny_models(root)["clip"]
    families = build_tiny_families(root / "families")
    images, captions = images_and_captions(args.pairs)
    print(f"ITM pairs/s at tiny shapes, {args.pairs} pairs, {args.batch} a call, {torch.get_num_threads()} threads")
    print(f"{'CLIPModel (cosine)':36s} {clip_rate(clip, args, images, captions):10.1f}")
    for folder in families.values():
        head = model_family(str(folder)).architecture  # the head its config names, as --model reads it
        print(f"{head:36s} {cross_encoder_rate(folder, head, args, images, captions):10.1f}")


if __name__ == "__main__":
    main()
