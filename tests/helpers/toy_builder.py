"""A toy builder for testing the sharded runner (not shipped): images + captions from a seed.

Run as a script (also under `accelerate launch`): python tests/helpers/toy_builder.py --output DIR ...
`--sleep` slows each item so a test can kill the run mid-way. `--items-from FILE` reads the item
ids from a text file (one per line) instead of `range(--n-items)`: a local input, which a relative
path makes each "machine" (working folder) of a multi-node test read from its own copy.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import datasets
import numpy as np
from PIL import Image

from builders.engine.seeding import derive_seed
from builders.engine.sharding.base import BuildInfo, Emit, OutputSpec, Skip

HELP = "toy dataset for runner tests"

MAIN = datasets.Features(
    {
        "id": datasets.Value("int64"),
        "image": datasets.Image(),
        "caption": datasets.Value("string"),
        "value": datasets.Value("float64"),
    }
)
CAPTIONS = datasets.Features({"id": datasets.Value("int64"), "caption": datasets.Value("string")})


@dataclass
class ToyConfig:
    n_items: int = 40
    seed: int = 0
    version_tag: str = "v1"
    items_from: str | None = None


class ToyBuilder:
    def __init__(self, config: ToyConfig, sleep_s: float = 0.0) -> None:
        # Not part of the config: a resumed run may change it without invalidating the build.
        self.config, self.sleep_s = config, sleep_s

    def outputs(self):
        return [
            OutputSpec("default", "train", MAIN),
            OutputSpec("default", "test", MAIN),
            OutputSpec("captions", "train", CAPTIONS),
        ]

    def work_items(self):
        if self.config.items_from:
            return [int(line) for line in Path(self.config.items_from).read_text().split()]
        return list(range(self.config.n_items))

    def source_option(self):
        cfg = self.config
        return f"--items-from {cfg.items_from}" if cfg.items_from else f"--n-items {cfg.n_items}"

    def process(self, items):
        for i in items:
            time.sleep(self.sleep_s)
            if i % 7 == 3:
                yield Skip("seven_three")
                continue
            if i % 11 == 5:
                yield Skip("bad_input", kind="error", detail=f"item {i}")
                continue
            rng = np.random.default_rng(derive_seed(self.config.seed, i))
            pixels = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
            caption = f"{self.config.version_tag} item {i}"
            split = "test" if i % 5 == 0 else "train"
            yield Emit(
                f"default/{split}",
                {"id": i, "image": Image.fromarray(pixels), "caption": caption, "value": float(rng.random())},
            )
            yield Emit("captions/train", {"id": i, "caption": caption})

    def info(self):
        return BuildInfo(
            builder="toy",
            card_template="dataset_card.md",
            pretty_name="Toy",
            config=asdict(self.config),
            card_fields={"license": "cc-by-4.0", "summary": "A toy dataset.", "limitations": ["It is a toy."]},
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n-items", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--version-tag", default="v1")
    parser.add_argument("--items-from", default=None)


def from_args(args: argparse.Namespace) -> ToyBuilder:
    return ToyBuilder(
        ToyConfig(n_items=args.n_items, seed=args.seed, version_tag=args.version_tag, items_from=args.items_from),
        sleep_s=args.sleep,
    )


if __name__ == "__main__":
    from builders.launch import launch_main

    sys.exit(launch_main(sys.modules[__name__]))
