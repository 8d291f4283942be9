"""Shared by the training tests: fixture builds, hand-made dataset folders in our builds' Hub
layout, and reading a run's outputs."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from datasets import Dataset, Features, Image, List, Value
from PIL import Image as PILImage

from helpers.build_helpers import kill_tree

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "training" / "finetune_clip.py"
PYTHON = sys.executable

COLORS = {
    "red": (220, 30, 30),
    "green": (30, 200, 40),
    "blue": (30, 40, 220),
    "yellow": (230, 220, 30),
    "purple": (140, 30, 160),
    "orange": (240, 140, 20),
    "black": (10, 10, 10),
    "white": (245, 245, 245),
}
TEMPLATES = ("a {} picture", "{}", "the color {}", "something {}", "all {} here")


def png(rgb, size=(40, 40), noise: int = 0, seed: int = 0) -> bytes:
    arr = np.empty((*size[::-1], 3), dtype=np.int16)
    arr[:] = rgb
    if noise:
        arr += np.random.default_rng(seed).integers(-noise, noise + 1, size=arr.shape)
    buf = io.BytesIO()
    PILImage.fromarray(arr.clip(0, 255).astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def write_split(root: Path, split: str, columns: dict, features: Features) -> None:
    """One parquet shard `data/SPLIT-00000-of-00001.parquet` (the `default` config)."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    Dataset.from_dict(columns, features=features).to_parquet(root / "data" / f"{split}-00000-of-00001.parquet")


REAL_FEATURES = Features(
    {
        "image": Image(),
        "image_id": Value("int64"),
        "caption_ids": List(Value("int64")),
        "captions": List(Value("string")),
    }
)


def write_color_set(root: Path, per_color: dict[str, int]) -> Path:
    """A coco-captions-shaped folder whose captions name the image's colour: per split, N images
    per colour, each with the five caption templates (ids unique across splits)."""
    image_id, caption_id = 1, 1
    for split, n in per_color.items():
        cols = {"image": [], "image_id": [], "caption_ids": [], "captions": []}
        for k in range(n):
            for name, rgb in COLORS.items():
                cols["image"].append({"bytes": png(rgb, noise=20, seed=image_id), "path": None})
                cols["image_id"].append(image_id)
                cols["caption_ids"].append(list(range(caption_id, caption_id + len(TEMPLATES))))
                cols["captions"].append([t.format(name) for t in TEMPLATES])
                image_id += 1
                caption_id += len(TEMPLATES)
        write_split(root, split, cols, REAL_FEATURES)
    return root


CF_FEATURES = Features(
    {
        "id": Value("string"),
        "image_0": Image(),
        "image_1": Image(),
        "caption_0": Value("string"),
        "caption_1": Value("string"),
        "source_image_id": Value("string"),
    }
)


#: Noise seeds of the counterfactual images, apart from the colour sets' (their image ids).
CF_SEEDS = 1_000_000


def write_counterfactuals(root: Path, image_ids: list[int], split: str = "test") -> Path:
    """A coco-counterfactuals-shaped folder: one pair per source image id."""
    cols = {k: [] for k in CF_FEATURES}
    names = list(COLORS)
    for p, image_id in enumerate(image_ids):
        a, b = names[p % len(names)], names[(p + 3) % len(names)]
        cols["id"].append(f"{image_id}_{p}")
        # Noise: every image its own bytes (the leakage guard matches images by content too).
        cols["image_0"].append({"bytes": png(COLORS[a], noise=20, seed=CF_SEEDS + 2 * p), "path": None})
        cols["image_1"].append({"bytes": png(COLORS[b], noise=20, seed=CF_SEEDS + 2 * p + 1), "path": None})
        cols["caption_0"].append(f"a {a} cube")
        cols["caption_1"].append(f"a {b} cube")
        cols["source_image_id"].append(str(image_id))
    write_split(root, split, cols, CF_FEATURES)
    return root


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def final_metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())["final_metrics"]


def weights(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


class OneProcessAccelerator:
    """The accelerator as the training step uses it: one process, no autocast, plain backward,
    with `device` as the run's device (tests set it apart from where the loader puts tensors)."""

    num_processes, process_index = 1, 0

    def __init__(self, device=None) -> None:
        self.device = device

    def autocast(self):
        return contextlib.nullcontext()

    def no_sync(self, model):
        return contextlib.nullcontext()

    def backward(self, loss):
        loss.backward()


def report_builds(root: Path, coco_root: Path) -> tuple[Path, Path, Path]:
    """The three datasets `counterfactory benchmark` tests score: a coco-captions test split and a
    decorrelation build of the COCO fixture, and hand-made counterfactual pairs, one per test
    image (the ITM groups must be equally long)."""
    from datasets import load_dataset

    from builders.app.cli import main as cli_main

    assert (
        cli_main(
            ["build", "coco-captions", "--coco-root", str(coco_root), "--splits", "test", "--output", str(root / "cc")]
        )
        == 0
    )
    assert (
        cli_main(
            ["build", "decorrelation", "--coco-root", str(coco_root), "--fill", "zero", "--output", str(root / "dec")]
        )
        == 0
    )
    n_test = len(load_dataset(str(root / "cc"), "default", split="test"))
    write_counterfactuals(root / "cf", list(range(1, n_test + 1)))
    return root / "cc", root / "dec", root / "cf"


def tiny_args(data, tiny_models_dir, out, *extra: str) -> list[str]:
    """`counterfactory train` on the color set `data` with the tiny models, one process, batch 16,
    into `out`, then `extra`."""
    return [
        "--real",
        str(data),
        "--real-train-splits",
        "train",
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--num-workers",
        "0",
        "--batch-size",
        "16",
        "--output",
        str(out),
        *extra,
    ]


def sign_flip_pvalue(a, b, resamples: int, seed: int, swapped=None) -> float:
    """training.sign_flip.sign_flip_pvalues of the one pair (a, b)."""
    from training.sign_flip import sign_flip_pvalues

    return sign_flip_pvalues({0: (a, b)}, resamples, seed, swapped)[0]


def kill_at_checkpoint(cmd: list[str], run: Path, step: int) -> None:
    """Start the training command `cmd` (output folder `run`) and SIGKILL it, with every process
    it started, as soon as the checkpoint of `step` is complete (its trainer_state.json)."""
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    marker = run / "checkpoints" / f"step-{step:08d}" / "trainer_state.json"
    deadline = time.time() + 300
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.time() < deadline, f"no checkpoint at step {step}"
        time.sleep(0.05)
    kill_tree(proc)  # its DataLoader worker too, which shares the output lock's descriptor
    assert not (run / "final").exists(), "the run finished before the kill"
