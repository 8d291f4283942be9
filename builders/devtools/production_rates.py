"""The production table of `benchmarks/gpu_check.py` (#43, #52 item 5): the figures a production
plan needs, in the dtypes a release runs in, one table printed before anything else.

- **The plan's assumptions** (`production_plan.Assumptions`), a row each: what is assumed rather
  than measured (early rejection's rate, independent of p; the release's size).
- **SD-1.5 Prompt-to-Prompt in fp16 at 512 px** (`generate_pairs`, `inject="self"`, each
  candidate its own rows: 4 UNet rows per candidate pair a step), over a sweep of candidate pairs
  per batch: UNet rows/s of the whole call (text encoding and the VAE decode included) and the
  peak GPU memory. A batch that runs out of memory ends the sweep as a row.
- **The same with `torch.compile` of the UNet** (`nn.Module.compile`, mode
  `max-autotune-no-cudagraphs` by default; `--compile-mode default` is the documented
  alternative when autotuning takes too long; CUDA graphs are left out because P2P's processors
  change the injected rows from step to step). It runs in a child process with its own time
  budget, so a compile that fails or does not finish is a row saying so. Reported apart: no build
  compiles the UNet, so no GPU-days figure uses it.
- **Each generator's stages** (`stage_rates`): its denoiser's rows/s at every batch its plans run
  (the mean rows a forward of each plan, `production_plan.count_plan`), the text encoding of a
  render call, the VAE decode per image, the CLIP filters per candidate pair and the injection's
  factor on the denoiser's time, measured through the build's render function at the production
  architecture with random weights, in the generator's dtype (fp16; bf16 for FLUX).
- **GPU-days of the release** for each generator's default model and every known model of its
  family (`GENERATORS`' reference settings: each at its own reference steps), under the paper's
  plan, the grouped plan with shared computation, and that plan with early rejection: rows,
  render calls, decodes and CLIP-scored pairs counted from the specs, priced with the stage costs
  (`production_plan.gpu_seconds`).
- **Each cross-encoder the report scores** (`family_rates`: BLIP ITM base and large, BridgeTower
  large ITM, ViLT, FLAVA) at its published size: ITM pairs/s and the peak GPU memory in fp16.

`tiny=True` (`gpu_check.py --cpu-tiny`) runs the same code on the tiny pipelines at 64 px on the
CPU in fp32, and compiles with dynamo's `eager` backend (inductor's CPU code generation needs a
C++ toolchain and minutes): the code runs, the numbers mean nothing.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from builders.devtools.doctor_generators import SHAPES
from builders.devtools.family_rates import family_rows, training_rows
from builders.counterfactuals.config import ImageStageConfig
from builders.devtools.generator_rates import GIB, device_memory, fits, timed
from builders.devtools.production_plan import (
    Assumptions,
    PlanCount,
    StageCosts,
    gpu_days,
    model_steps,
    plans,
    release_counts,
)
from builders.devtools.stage_rates import (
    CAPTIONS,
    TINY_SIDE,
    clip_seconds,
    denoiser_of,
    free,
    generator_pipeline,
    plain_rate,
    render_stages,
    sd_pipeline,
)

log = logging.getLogger(__name__)

#: Candidate pairs per UNet batch of the fp16 sweep (x4 UNet rows: 2 images x 2 guidance halves).
PAIR_SWEEP = (2, 5, 10, 20)
TINY_SWEEP = (1, 2)
COMPILE_MODE = "max-autotune-no-cudagraphs"
#: Seconds the compiled stage may take, compilation included, before it is reported unfinished.
COMPILE_BUDGET = 180
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
    size = TINY_SIDE if tiny else 512
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
    #: Denoising steps of the timed render calls (the stage costs do not depend on the count).
    stage_steps: int = 4
    assume: Assumptions = Assumptions()


def model_counts(name: str, assume: Assumptions) -> dict[tuple[str, int], dict[str, PlanCount]]:
    """(model, reference steps) -> each plan's counts, for `name`'s default and known models."""
    halves = SHAPES[name].rows_per_pair // 2
    return {(model, steps): release_counts(assume, steps, halves) for model, steps in model_steps(name)}


def stage_costs(name: str, cfg: TableConfig, scorer, counts) -> tuple[StageCosts, list[Row]]:
    """`name`'s measured stage costs (builders/devtools/stage_rates.py) and their rows: the plain
    denoiser at every batch its plans run (`counts`: `model_counts`), then one render call with
    the stage timers."""
    shape = SHAPES[name]
    dtype, side = ("fp32", TINY_SIDE) if cfg.tiny else (shape.dtype, shape.resolution)
    pairs = ImageStageConfig().candidate_batch
    render_rows = pairs * shape.rows_per_pair
    every = [c for plans_ in counts.values() for c in plans_.values()]
    batches = sorted({max(1, round(c.rows_per_forward)) for c in every} | {render_rows})
    _reset_peak(cfg.device)
    start = time.perf_counter()
    pipe = generator_pipeline(name, cfg.device, cfg.tiny, cfg.tiny_dir, dtype)
    # One timed forward after a warm-up per batch: FLUX at 1024 px takes seconds a forward.
    plain = {rows: plain_rate(denoiser_of(pipe), rows, side, cfg.device, 1) for rows in batches}
    render = render_stages(pipe, name, cfg.device, side, pairs, cfg.stage_steps)
    del pipe
    free(cfg.device)
    inside = render["rows"] / render["denoiser_s"]
    costs = StageCosts(
        render["text_s"],
        render["vae_s"],
        clip_seconds(scorer, side, pairs, cfg.device),
        plain,
        plain[render_rows] / inside,
    )
    where = f"{dtype}, {side} px"
    stage = f"stage {name}"
    rows = [Row(stage, f"{where}, denoiser, {n} rows a forward", rate, "rows/s") for n, rate in plain.items()]
    rows += [
        Row(stage, f"{where}, text encoding, one render call", costs.text_s, "s per call"),
        Row(stage, f"{where}, VAE decode", costs.vae_s, "s per image"),
        Row(stage, f"{where}, CLIP filters (ViT-L/14)", costs.clip_s, "s per candidate pair"),
        Row(
            stage,
            f"{where}, injection, {pairs} pairs a batch ({render_rows} rows), p 0.5, {cfg.stage_steps} steps",
            costs.injection,
            "x denoiser time",
            _peak(cfg.device),
            time.perf_counter() - start,
            f"{inside:.4g} rows/s inside the render call, as a build runs it",
        ),
    ]
    return costs, rows


def gpu_day_rows(name: str, costs: StageCosts, assume: Assumptions, counts) -> list[Row]:
    """The release's GPU-days of `name`'s default and known models under each plan, at each
    model's reference steps (`counts`: `model_counts`; `production_plan.gpu_days`)."""
    out = []
    for (model, steps), by_plan in counts.items():
        for plan, count in by_plan.items():
            batch = plans(assume)[plan][0].get("candidate_batch", ImageStageConfig().candidate_batch)
            at, rate = costs.rate_at(count.rows_per_forward)
            note = (
                f"per caption pair: {count.rows:.6g} rows ({count.rows_per_forward:.4g} a forward; rate at {at}: "
                f"{rate:.4g} rows/s), {count.calls:.4g} calls, {count.decodes:.4g} decodes, "
                f"{count.scored:.4g} CLIP pairs"
            )
            setting = f"{model}: {plan}, {steps} steps, candidate_batch {batch}"
            out.append(Row(f"GPU-days {name}", setting, gpu_days(count, costs, assume), "GPU-days", note=note))
    return out


def too_big(name: str, cfg: TableConfig, counts) -> str:
    """Why `name`'s denoiser and its largest batch do not fit the device ('' when they do, and
    always with the tiny models)."""
    if cfg.tiny:
        return ""
    shape = SHAPES[name]
    rows = max(c.rows_per_forward for by_plan in counts.values() for c in by_plan.values())
    pairs = max(ImageStageConfig().candidate_batch, math.ceil(rows / shape.rows_per_pair))
    return fits(name, cfg.device, shape.dtype, pairs, device_memory(cfg.device))


def generator_rows(cfg: TableConfig, emit) -> list[Row]:
    """Every generator's stage rows and GPU-days, each generator's passed to `emit` once done; a
    generator whose stages fail is a row saying why (logged with its traceback), and the others
    still run."""
    from builders.devtools.doctor_models import ModelSource
    from builders.models.profiles import tiny_profile

    scorer = ModelSource("tiny" if cfg.tiny else "production", tiny_profile(cfg.tiny_dir), cfg.device).get(
        "clip_filter"
    )
    rows = []
    for name in cfg.generators:
        counts = model_counts(name, cfg.assume)
        if reason := too_big(name, cfg, counts):
            rows += emit([Row(f"stage {name}", "stages", None, "", note=f"skipped, no GPU-days: {reason}")])
            continue
        try:
            costs, done = stage_costs(name, cfg, scorer, counts)
            done += gpu_day_rows(name, costs, cfg.assume, counts)
        except Exception as err:  # a row per failed generator: the GPU session is one call
            log.exception("production table: %s stages failed", name)
            done = [Row(f"stage {name}", "stages", None, "", note=f"failed, no GPU-days: {str(err)[:160]}")]
            free(cfg.device)
        rows += emit(done)
    return rows


def sd15_rows(cfg: TableConfig) -> list[Row]:
    """The SD-1.5 P2P sweep and the compiled row (reported apart: no build compiles the UNet)."""
    dtype = "fp32" if cfg.tiny else "fp16"  # CPUs lack fast fp16 kernels
    size, sweep = (TINY_SIDE, TINY_SWEEP) if cfg.tiny else (512, cfg.sweep)
    pipe = sd_pipeline(cfg.device, cfg.tiny, cfg.tiny_dir, dtype)
    rows = p2p_sweep(pipe, cfg.device, dtype, sweep, cfg.steps, size, repeats=1 if cfg.tiny else 2)
    del pipe  # the child process builds its own
    _reset_peak(cfg.device)
    ran = [(r.value, pairs) for pairs, r in zip(sweep, rows, strict=False) if r.value is not None]
    if ran:
        pairs = max(ran)[1]  # the compiled stage runs the fastest batch
        row = compiled_row(
            cfg.device, cfg.tiny, cfg.tiny_dir, dtype, pairs, cfg.steps, cfg.compile_mode, cfg.compile_budget
        )
        row.note = "; ".join(filter(None, [row.note, "apart: no build compiles the UNet, no GPU-days use it"]))
        rows.append(row)
    return rows


def table_header(cfg: TableConfig) -> dict[str, str]:
    """The device, the torch version and the dtype of the table."""
    import torch

    device_name = torch.cuda.get_device_name(cfg.device) if cfg.device.startswith("cuda") else "CPU"
    return {"device": device_name, "torch": torch.__version__, "dtype": "fp32" if cfg.tiny else "fp16 (FLUX bf16)"}


def production_table(cfg: TableConfig, emit=lambda rows: rows) -> list[Row]:
    """Every row of the table, each section passed to `emit` (which returns it) as it is done:
    a run cut short has printed what it measured."""
    rows = emit([Row("assumption", line, None, "") for line in cfg.assume.lines()])
    rows += emit(sd15_rows(cfg))
    rows += generator_rows(cfg, emit)
    rows += emit(family_rows(cfg, Row, _reset_peak, _peak))
    return rows + emit(training_rows(cfg, Row, _reset_peak, _peak))


def format_header(header: dict[str, str]) -> str:
    """The table's first lines: `header` (device, torch version, dtype), the column names."""
    return "\n".join(
        [
            "production table: " + ", ".join(f"{k} {v}" for k, v in header.items()),
            "| stage | setting | value | unit | peak GiB | s | note |",
            "|---|---|---:|---|---:|---:|---|",
        ]
    )


def format_row(r: Row) -> str:
    """One markdown line; values to 4 significant digits (the stage costs span 1e-3 to 1e3)."""
    cells = [
        r.stage,
        r.setting,
        "—" if r.value is None else f"{r.value:.4g}",
        r.unit,
        "—" if r.peak_gib is None else f"{r.peak_gib:.1f}",
        "—" if r.seconds is None else f"{r.seconds:.0f}",
        r.note,
    ]
    return "| " + " | ".join(cells) + " |"


def format_table(rows: list[Row], header: dict[str, str]) -> str:
    return "\n".join([format_header(header), *map(format_row, rows)])


def print_table(cfg: TableConfig, out: Path, write) -> list[dict]:
    """The table passed line by line to `write` as measured (a run cut short keeps what it
    measured), then written whole to `out`; its rows as dicts."""
    header = table_header(cfg)
    write(format_header(header))

    def emit(rows: list[Row]) -> list[Row]:
        for row in rows:
            write(format_row(row))
        return rows

    rows = production_table(cfg, emit)
    out.write_text(format_table(rows, header) + "\n")
    return [asdict(r) for r in rows]


if __name__ == "__main__":  # the compiled stage's child process (`compiled_row`)
    logging.basicConfig(level=logging.WARNING)
    device, tiny, tiny_dir, dtype, pairs, steps, mode = json.loads(sys.argv[1])
    print(json.dumps(asdict(compiled_rate(device, tiny, Path(tiny_dir), dtype, pairs, steps, mode))))
