"""Training steps/s and peak memory per model family at tiny shapes (run by hand; not a test).

Each family's optimizer step as the trainer takes it (training/trainer.py): CLIP's contrastive
step (`training.accumulation.accumulate_gradients`), BLIP's ITC + ITM with hard negatives and
BridgeTower's ITM with in-batch hard negatives (`training.cross_training.cross_encoder_step`),
then AdamW, on the tiny random-init checkpoints (`counterfactory models tiny`), one process,
batch `--batch` of random pixels and distinct captions. Each family runs in a fresh subprocess, so
its peak memory is its own: the process's peak resident set on CPU (`ru_maxrss`, the interpreter
and libraries included: compare the families with each other), `torch.cuda.max_memory_allocated`
on a GPU. Rates are the best of `--repeats` timings of `--steps` steps after two warm-up steps.

Run: `python benchmarks/training_families.py [--batch 16] [--steps 10] [--repeats 3] [--device cpu]`
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FAMILIES = ("clip", "blip", "bridgetower")


def _model(family: str, tiny_dir: Path | None):
    from builders.models.clip_ids import parse_clip_id
    from builders.models.profiles import tiny_profile
    from builders.models.tiny_families import build_tiny_families
    from training.cross_training import load_training_backend

    clip = tiny_profile(tiny_dir).clip
    model = clip if family == "clip" else str(build_tiny_families(Path(clip).parent / "families")[family])
    return load_training_backend(parse_clip_id(model, "transformers"), family)


def one_family(family: str, batch: int, steps: int, repeats: int, device: str, tiny_dir: Path | None) -> dict:
    from training.accumulation import accumulate_gradients
    from training.cross_training import cross_encoder_step
    from builders.devtools.family_training import OneProcess
    from training.data import to_device

    backend = _model(family, tiny_dir)
    module = backend.module.to(device).train()
    opt = torch.optim.AdamW(module.parameters(), lr=1e-5)
    size = backend.image_size
    words = ("red", "green", "blue", "yellow", "purple", "orange", "black", "white")
    texts = [f"a {words[i % 8]} {words[(i // 8) % 8]} picture" for i in range(batch)]
    b = to_device(
        {
            "pixel_values": torch.randn(batch, 3, size, size),
            "text": backend.tokenize(texts),
            "image_key": torch.arange(batch),
        },
        device,
    )
    acc = OneProcess(device)

    def step(k: int) -> None:
        if backend.dual_encoder:
            accumulate_gradients(module, [b], acc)
        else:
            cross_encoder_step(module, b, acc, backend, seed=k)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for k in range(2):
        step(k)
    rates = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for k in range(steps):
            step(k)
        if device == "cuda":
            torch.cuda.synchronize()
        rates.append(steps / (time.perf_counter() - start))
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if device == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    params = sum(p.numel() for p in module.parameters())
    return {"family": family, "steps_per_s": max(rates), "peak_mib": peak, "params": params}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny-models-dir", type=Path, default=None)
    p.add_argument("--one", choices=FAMILIES, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        torch.set_num_threads(1)
        res = one_family(args.one, args.batch, args.steps, args.repeats, args.device, args.tiny_models_dir)
        print(json.dumps(res))
        return
    memory = "GPU max_memory_allocated" if args.device == "cuda" else "process peak RSS"
    print(f"tiny models, batch {args.batch}, {args.device}, 1 thread, best of {args.repeats} x {args.steps} steps")
    print(f"{'family':<12} {'params':>9} {'steps/s':>8} {'images/s':>9} {memory + ' (MiB)':>32}")
    for family in FAMILIES:
        cmd = [sys.executable, __file__, "--one", family, *sys.argv[1:]]
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
        print(
            f"{family:<12} {out['params']:>9,} {out['steps_per_s']:>8.2f} "
            f"{out['steps_per_s'] * args.batch:>9.1f} {out['peak_mib']:>32.0f}"
        )


if __name__ == "__main__":
    main()
