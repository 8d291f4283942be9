"""The production table of `benchmarks/gpu_check.py` (#43): the figures of the dtypes a release
runs in, one table printed before anything else.

- **SD-1.5 Prompt-to-Prompt in fp16 at 512 px** (`generate_pairs`, `inject="self"`, each
  candidate its own rows: 4 UNet rows per candidate pair a step), over a sweep of candidate pairs
  per batch: UNet rows/s of the whole call (text encoding and the VAE decode included, as a build
  pays them) and the peak GPU memory. A batch that runs out of memory ends the sweep as a row.
- **The same with `torch.compile` of the UNet** (`nn.Module.compile`, mode
  `max-autotune-no-cudagraphs` by default; `--compile-mode default` is the documented
  alternative when autotuning takes too long: inductor's kernels without the GEMM search; CUDA
  graphs are left out because P2P's processors change the injected rows from step to step). It
  runs in a child process with its own time budget, so a compile that fails or does not finish
  is a row saying so, never the end of the check. The processors read the controller's step, so
  dynamo may compile more than one graph: the row gives how many.
- **Each generator's denoiser** at its native resolution and reference dtype (fp16; bf16 for
  FLUX), random weights at the real config sizes (`generator_rates`).
- **The release's GPU-days** (24,508 caption pairs, builders/counterfactuals/METHOD.md §2) at the
  best fp16 rate: the paper's plan (100 independent candidates x 100 steps) beside the
  production plan (grouped 10 seeds x 10 p values with shared computation, then early rejection).
  The UNet rows of each plan are counted from the candidate specs (`row_keys`); how many
  candidates early rejection drops needs real weights, so its rate is an assumption the row
  states (`REJECT_RATE` at `REJECT_AT` of the steps); the preview's VAE decode and CLIP pass are
  not counted.

`tiny=True` (`gpu_check.py --cpu-tiny`) runs the same code on the tiny pipeline at 64 px on the
CPU in fp32, and compiles with dynamo's `eager` backend (inductor's CPU code generation needs a
C++ toolchain and minutes): the code runs, the numbers mean nothing.
"""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from builders.devtools.generator_rates import GIB, generator_rate, timed

log = logging.getLogger(__name__)

#: Candidate pairs per UNet batch of the fp16 sweep (x4 UNet rows: 2 images x 2 guidance halves).
PAIR_SWEEP = (2, 5, 10, 20)
TINY_SWEEP = (1, 2)
COMPILE_MODE = "max-autotune-no-cudagraphs"
#: Seconds the compiled stage may take, compilation included, before it is reported unfinished.
COMPILE_BUDGET = 180
RELEASE_CAPTION_PAIRS = 24_508
PRODUCTION_STEPS = 100
#: Early rejection of the production plan: preview at half the steps; half of the candidates
#: assumed rejected there (unmeasured: it needs the real models' previews).
REJECT_AT, REJECT_RATE = 0.5, 0.5
CAPTIONS = ("A man riding a brown horse.", "A man riding a brown elephant.")
#: The project root: the child process imports the project from it.
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Row:
    """One line of the production table."""

    stage: str
    setting: str
    value: float | None
    unit: str
    peak_gib: float | None = None
    seconds: float | None = None
    note: str = ""


def sd_pipeline(device: str, tiny: bool, tiny_dir: Path, dtype: str):
    """SD-1.5 with random weights at its real size (the tiny pipeline with `tiny`) in `dtype`."""
    from builders.devtools.doctor_generators import torch_dtype
    from builders.devtools.doctor_models import ModelSource
    from builders.models.profiles import tiny_profile

    pipe = ModelSource("tiny" if tiny else "production", tiny_profile(tiny_dir), device).get("sd")
    return pipe if dtype == "fp32" else pipe.to(torch_dtype(dtype))


def _reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: str) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated(device) / GIB if device.startswith("cuda") else None


def p2p_rate(pipe, device: str, pairs: int, steps: int, size: int, repeats: int) -> float:
    """UNet rows/s of `generate_pairs` on `pairs` candidate pairs (fastest of `repeats` calls
    after a warm-up)."""
    from builders.counterfactuals.prompt_to_prompt import PairSpec, UNetWork, generate_pairs

    specs = [PairSpec(seed=k, p=0.5, guidance=7.5) for k in range(pairs)]
    work = UNetWork()

    def once() -> None:
        generate_pairs(pipe, *CAPTIONS, specs, steps=steps, size=size, inject="self", share=False, work=work)

    seconds = timed(once, device, repeats)
    return work.unet_rows / (repeats + 1) / seconds


def p2p_sweep(pipe, device: str, dtype: str, sweep, steps: int, size: int, repeats: int) -> list[Row]:
    """A row per batch size of the sweep; the first that runs out of memory ends it."""
    import torch

    rows = []
    for pairs in sweep:
        setting = f"{dtype}, {size} px, {pairs} pairs a batch ({4 * pairs} UNet rows), {steps} steps"
        _reset_peak(device)
        start = time.perf_counter()
        try:
            rate = p2p_rate(pipe, device, pairs, steps, size, repeats)
        except torch.cuda.OutOfMemoryError as err:
            rows.append(Row("SD-1.5 P2P", setting, None, "UNet rows/s", note=f"out of memory: {str(err)[:80]}"))
            break
        rows.append(Row("SD-1.5 P2P", setting, rate, "UNet rows/s", _peak(device), time.perf_counter() - start))
    _reset_peak(device)
    return rows


def compiled_rate(device: str, tiny: bool, tiny_dir: Path, dtype: str, pairs: int, steps: int, mode: str) -> Row:
    """The child's side of the compiled stage: the UNet compiled, the fastest of two calls after
    a warm-up (the row's seconds count the warm-up, where the compilation happens)."""
    import torch

    pipe = sd_pipeline(device, tiny, tiny_dir, dtype)
    size = 64 if tiny else 512
    if tiny:
        pipe.unet.compile(backend="eager")
    else:
        pipe.unet.compile(mode=mode)
    setting = f"{dtype}, {size} px, {pairs} pairs a batch, {steps} steps, torch.compile " + (
        "backend eager" if tiny else f"mode {mode}"
    )
    _reset_peak(device)
    start = time.perf_counter()
    rate = p2p_rate(pipe, device, pairs, steps, size, repeats=2)
    graphs = torch._dynamo.utils.counters["stats"].get("unique_graphs", 0)
    return Row(
        "SD-1.5 P2P compiled",
        setting,
        rate,
        "UNet rows/s",
        _peak(device),
        time.perf_counter() - start,
        f"{graphs} graph(s) compiled under the P2P processors",
    )


def compiled_row(
    device: str, tiny: bool, tiny_dir: Path, dtype: str, pairs: int, steps: int, mode: str, budget: float
):
    """`compiled_rate` in a child process limited to `budget` seconds; a failure is a row."""
    setting = f"{dtype}, {pairs} pairs a batch, {steps} steps, torch.compile mode {mode}"
    cmd = [sys.executable, "-m", __name__, json.dumps([device, tiny, str(tiny_dir), dtype, pairs, steps, mode])]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=budget)
    except subprocess.TimeoutExpired:
        return Row(
            "SD-1.5 P2P compiled", setting, None, "UNet rows/s", seconds=budget, note=f"not done within {budget:.0f} s"
        )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return Row(
            "SD-1.5 P2P compiled",
            setting,
            None,
            "UNet rows/s",
            seconds=time.perf_counter() - start,
            note=f"failed: {last[:160]}",
        )
    return Row(**json.loads(proc.stdout.strip().splitlines()[-1]))


def generator_rows(device: str, names, tiny: bool) -> list[Row]:
    rows = []
    for name in names:
        start = time.perf_counter()
        r = generator_rate(name, device, tiny=tiny, repeats=1 if tiny else 3, pairs=1 if tiny else 2)
        setting = f"{r.dtype}, {r.resolution} px, {r.rows} rows a step, random weights"
        value = None if r.skipped else r.rows_per_s
        note = r.skipped or f"{r.pairs_per_s:.3f} pairs/s at {r.steps} steps (denoiser only)"
        rows.append(
            Row(
                f"denoiser {name}",
                setting,
                value,
                "rows/s",
                r.peak_gib or None,
                time.perf_counter() - start,
                note,
            )
        )
    return rows


def plan_rows(plan: dict, share: bool, row_ids, reject_rate: float = 0.0) -> float:
    """Mean UNet rows per caption pair of `plan` (ImageStageConfig fields) at 100 steps, counted
    from its specs by `row_keys` (no model runs), with or without the shared computation and,
    with `reject_rate`, early rejection at `REJECT_AT` of the steps dropping that fraction of
    each batch's candidates (a seeded draw per caption pair)."""
    from builders.counterfactuals.config import ImageStageConfig
    from builders.counterfactuals.images import candidate_batches, candidate_specs
    from builders.counterfactuals.prompt_to_prompt import row_keys

    cfg = ImageStageConfig(steps=PRODUCTION_STEPS, early_reject_at=REJECT_AT if reject_rate else None, **plan)
    at = cfg.early_reject_step()
    total = 0
    for row_id in row_ids:
        rng = random.Random(row_id)
        for batch in candidate_batches(candidate_specs(0, row_id, cfg), cfg.candidate_batch):
            for i in range(PRODUCTION_STEPS):
                total += 2 * len(set(row_keys(batch, PRODUCTION_STEPS, i, share)))
                if i == at:
                    batch = [s for s in batch if rng.random() >= reject_rate]
    return total / len(row_ids)


def release_rows(sample: int = 20) -> dict[str, float]:
    """UNet rows per caption pair of the paper's plan and of the production plan (without and
    with early rejection), over `sample` caption pairs' specs."""
    ids = [f"release-{k}" for k in range(sample)]
    grouped = dict(candidate_plan="grouped", seeds=10, p_values=10, candidate_batch=10)
    return {
        "paper plan (100 independent candidates x 100 steps)": plan_rows(dict(candidates=100), False, ids),
        "production: grouped 10 x 10, shared computation": plan_rows(grouped, True, ids),
        f"production: grouped 10 x 10, shared + early rejection at {REJECT_AT:g} of the steps "
        f"(assumed: {REJECT_RATE:.0%} of candidates rejected)": plan_rows(grouped, True, ids, REJECT_RATE),
    }


def gpu_day_rows(rate: Row) -> list[Row]:
    """The release's GPU-days of each plan at the UNet rows/s of `rate` (a row of the table)."""
    return [
        Row(
            "release GPU-days",
            plan,
            RELEASE_CAPTION_PAIRS * rows / rate.value / 86_400,
            "GPU-days",
            note=f"{rows:,.0f} UNet rows per caption pair at {rate.value:.1f} rows/s ({rate.stage}: {rate.setting})",
        )
        for plan, rows in release_rows().items()
    ]


@dataclass
class TableConfig:
    """What the production table measures (`gpu_check.py` flags)."""

    device: str
    tiny: bool
    tiny_dir: Path
    generators: tuple[str, ...]
    steps: int = 10
    sweep: tuple[int, ...] = PAIR_SWEEP
    compile_mode: str = COMPILE_MODE
    compile_budget: float = COMPILE_BUDGET


def production_table(cfg: TableConfig) -> tuple[list[Row], dict[str, str]]:
    """Every row of the table and its header (device, torch version, dtype)."""
    import torch

    dtype = "fp32" if cfg.tiny else "fp16"  # CPUs lack fast fp16 kernels
    size, sweep = (64, TINY_SWEEP) if cfg.tiny else (512, cfg.sweep)
    device_name = torch.cuda.get_device_name(cfg.device) if cfg.device.startswith("cuda") else "CPU"
    header = {"device": device_name, "torch": torch.__version__, "dtype": "fp32" if cfg.tiny else "fp16 (FLUX bf16)"}
    pipe = sd_pipeline(cfg.device, cfg.tiny, cfg.tiny_dir, dtype)
    rows = p2p_sweep(pipe, cfg.device, dtype, sweep, cfg.steps, size, repeats=1 if cfg.tiny else 2)
    del pipe  # the child process builds its own
    _reset_peak(cfg.device)
    ran = [(r.value, pairs) for pairs, r in zip(sweep, rows, strict=False) if r.value is not None]
    if ran:
        pairs = max(ran)[1]  # the compiled stage runs the fastest batch
        rows.append(
            compiled_row(
                cfg.device, cfg.tiny, cfg.tiny_dir, dtype, pairs, cfg.steps, cfg.compile_mode, cfg.compile_budget
            )
        )
    rows += generator_rows(cfg.device, cfg.generators, cfg.tiny)
    rates = [r for r in rows if r.stage.startswith("SD-1.5") and r.value]
    if rates:
        best = max(rates, key=lambda r: r.value)
        rows += gpu_day_rows(best)
    return rows, header


def format_table(rows: list[Row], header: dict[str, str]) -> str:
    """The table as markdown, after a line of `header` (device, torch version, dtype)."""
    lines = [
        "production table: " + ", ".join(f"{k} {v}" for k, v in header.items()),
        "| stage | setting | value | unit | peak GiB | s | note |",
        "|---|---|---:|---|---:|---:|---|",
    ]
    for r in rows:
        cells = [
            r.stage,
            r.setting,
            "—" if r.value is None else f"{r.value:.2f}",
            r.unit,
            "—" if r.peak_gib is None else f"{r.peak_gib:.1f}",
            "—" if r.seconds is None else f"{r.seconds:.0f}",
            r.note,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":  # the compiled stage's child process (`compiled_row`)
    logging.basicConfig(level=logging.WARNING)
    device, tiny, tiny_dir, dtype, pairs, steps, mode = json.loads(sys.argv[1])
    print(json.dumps(asdict(compiled_rate(device, tiny, Path(tiny_dir), dtype, pairs, steps, mode))))
