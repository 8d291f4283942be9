"""`counterfactory doctor`: one item through every stage with the production architectures, and
for each stage its time, its memory and the batch size that fits a 24 / 40 / 80 GB GPU in fp16.

Memory is measured, not estimated: on CUDA `torch.cuda.max_memory_allocated` during the stage; on
the CPU the process's resident set (RSS), sampled every few milliseconds by a thread (a peak
shorter than the interval can be missed), with malloc set to return freed tensor memory at once
(`follow_tensors_in_rss`). The weights are counted from the parameters; the
activation memory of one item is the stage's peak minus what the process held when it started
(for a training stage, minus the gradients and the AdamW moments, 12 bytes per parameter).

The batch size is extrapolated, and says so: from fp32 measurements to fp16 (weights and
activations at half size); for a training stage, mixed precision keeps fp32 weights, gradients
and AdamW moments (16 bytes per parameter) with fp16 activations; for the image stages run below
512 px, the activations are scaled by the area ratio to 512 px (the attention runs through
`scaled_dot_product_attention`, whose memory grows with the tokens, not with their square).
10% of each GPU is left for the CUDA context and the allocator's fragmentation.

After the stages, a row per image-stage generator (sd15, sdxl, sd3, flux): weights per dtype,
activations per candidate pair at the model's resolution and the pairs that fit each GPU, with
and without `--cpu-offload` (builders/devtools/doctor_generators.py: measured where the model
fits this machine, meta-device arithmetic otherwise).
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from builders.devtools.doctor_models import ModelSource
from builders.devtools.doctor_stages import STAGE_NAMES, STAGES, Stage, StageSettings
from builders.devtools.peak_memory import PeakMemory
from builders.engine.errors import OutputError, UserFacingError

log = logging.getLogger(__name__)

GPU_GIB = (24, 40, 80)
PRODUCTION_RESOLUTION = 512
HEADROOM = 0.9
#: Activation memory below this is noise of the RSS measurement, not a per-item cost.
MEASUREMENT_FLOOR = 1 << 20
#: Gradients (fp32) and AdamW's two moments (fp32) per parameter.
TRAIN_STATE_BYTES = 12
#: fp32 master weights + gradients + AdamW moments under mixed precision.
TRAIN_STATIC_BYTES = 16
MIB = 1 << 20


@dataclass
class DoctorConfig:
    stages: tuple[str, ...] = STAGE_NAMES
    resolution: int = PRODUCTION_RESOLUTION
    steps: int = 2
    #: `production` (real architectures, random weights) or `tiny` (the tiny profile).
    size: str = "production"
    tiny_dir: Path | None = None
    #: Image-stage generators given a row after the stages (`--generators`, checked by
    #: `doctor_generators.check_generators`; the doctor's stages do not use them).
    generators: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [s for s in self.stages if s not in STAGE_NAMES]
        if unknown:
            raise UserFacingError(
                f"--stages: unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGE_NAMES)}"
            )
        if not self.stages and not self.generators:
            raise UserFacingError("--stages: name at least one stage (or a generator with --generators)")
        if self.resolution < 64 or self.resolution % 64:
            raise UserFacingError(f"--resolution must be a multiple of 64 (at least 64), got {self.resolution}")
        if self.steps < 1:
            raise UserFacingError(f"--steps must be at least 1, got {self.steps}")


@dataclass
class Row:
    stage: str
    models: str
    seconds: float
    weights_mib: float
    activation_mib_per_item: float
    peak_mib: float
    items: int
    unit: str
    #: GPU memory (GiB) -> the batch (in `unit`) that fits it in fp16, extrapolated.
    batch_fp16: dict[str, int] = field(default_factory=dict)
    note: str = ""
    #: A training row's recipe batch (examples) and the GPU memory (GiB, fp16) a step of it takes.
    recipe_batch: int = 0
    recipe_batch_gib: float | None = None
    #: MiB a pair of the B x B no-gradient pass takes (measured in fp32; 0: none).
    square_mib_per_pair: float = 0.0


def follow_tensors_in_rss() -> None:
    """Make the CPU RSS follow the tensors: glibc's malloc raises its mmap threshold after large
    frees (up to 32 MiB) and then serves later allocations from heap memory freed earlier, which
    the RSS never shows again (a stage run after a bigger one measured nothing). A fixed 64 KiB
    threshold maps every tensor block of its own and returns it on free. No-op off glibc."""
    import ctypes
    import ctypes.util

    m_mmap_threshold = -3
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(m_mmap_threshold, 64 << 10)
    except (OSError, AttributeError):
        log.info("doctor: not glibc; the RSS may miss memory reused from earlier stages")


def fitting_batch(gpu_gib: float, static_bytes: float, per_item_bytes: float, square_bytes: float = 0.0) -> int:
    """Items per batch that fit `gpu_gib` next to `static_bytes` (0: not even the weights); with
    `square_bytes`, a batch of B also runs a pass over B x B pairs of that many bytes each, before
    the activations of the step are held (the larger of the two counts)."""
    free = gpu_gib * (1 << 30) * HEADROOM - static_bytes
    if free <= 0:
        return 0
    batch = int(free // per_item_bytes)
    return min(batch, math.isqrt(int(free // square_bytes))) if square_bytes > 0 else batch


def recipe_memory(stage: Stage, static: float, per_item_fp16: float, square_fp16: float) -> tuple[int, float, str]:
    """(recipe batch, its GiB, a note) of a training stage with a recipe: the fixed bytes plus the
    larger of the step's activations (batch x per item) and the B x B no-gradient pass."""
    from builders.devtools.family_training import recipe_batch

    b = recipe_batch(stage.recipe)
    step, square = b * per_item_fp16, b * b * square_fp16
    gib = (static + max(step, square)) / (1 << 30)
    note = (
        f"{stage.recipe} batch {b}: {gib:.1f} GiB = {static / (1 << 30):.1f} fixed (16 B/param) "
        f"+ {step / (1 << 30):.1f} activations"
    )
    if square:
        note += f"; B x B no-grad pass {b * b:,} pairs {square / (1 << 30):.1f} GiB, the larger counts"
    return b, round(gib, 2), note


def measure(stage: Stage, src: ModelSource, settings: StageSettings, shared: dict) -> Row:
    """Build the stage's models, then run it once under `PeakMemory`."""
    for key in stage.needs:
        src.get(key)
    params = sum(src.params(key) for key in stage.needs)
    start = time.perf_counter()
    with PeakMemory(src.device) as memory:
        result = stage.run(src, settings, shared)
    seconds = time.perf_counter() - start
    activation = memory.peak - memory.base - (TRAIN_STATE_BYTES * params if stage.train else 0)
    notes = [result.note] if result.note else []
    if activation < MEASUREMENT_FLOOR:
        notes.append("activations below the measurement floor (counted as 1 MiB)")
    per_item = max(activation, MEASUREMENT_FLOOR) / result.items
    scale = 1.0
    if stage.per_pixel and settings.resolution != PRODUCTION_RESOLUTION:
        scale = (PRODUCTION_RESOLUTION / settings.resolution) ** 2
        notes.append(
            f"real-size model at {settings.resolution} px, {settings.steps} step(s); activations x{scale:g} to 512 px"
        )
    static = params * (TRAIN_STATIC_BYTES if stage.train else 2)
    per_item_fp16 = per_item / 2 * scale
    square_fp16 = result.square_bytes_per_pair / 2
    recipe = recipe_memory(stage, static, per_item_fp16, square_fp16) if stage.recipe else (0, None, "")
    notes += [recipe[2]] if recipe[2] else []
    return Row(
        stage=stage.name,
        models=stage.models,
        seconds=round(seconds, 2),
        weights_mib=round(params * 4 / MIB, 1),
        activation_mib_per_item=round(per_item / MIB, 1),
        peak_mib=round((params * 4 + max(memory.peak - memory.base, 0)) / MIB, 1),
        items=result.items,
        unit=stage.unit,
        batch_fp16={str(g): fitting_batch(g, static, per_item_fp16, square_fp16) for g in GPU_GIB},
        note="; ".join(notes),
        recipe_batch=recipe[0],
        recipe_batch_gib=recipe[1],
        square_mib_per_pair=round(result.square_bytes_per_pair / MIB, 3),
    )


def run_doctor(config: DoctorConfig, on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """Every chosen stage in order; `on_row` sees each row as soon as it is measured (a long CPU
    run that is cut short still shows the stages it finished)."""
    from builders.engine.distributed import worker_device
    from builders.models.profiles import tiny_profile

    src = ModelSource(config.size, tiny_profile(config.tiny_dir), worker_device())
    if not src.device.startswith("cuda"):
        follow_tensors_in_rss()
    settings = StageSettings(config.resolution, config.steps)
    chosen = [s for s in STAGES if s.name in config.stages]
    rows, shared = [], {}
    for n, stage in enumerate(chosen):
        # Hold only what this and the later stages need: the big models one family at a time.
        src.keep({key for later in chosen[n:] for key in later.needs})
        log.info("doctor: %s", stage.name)
        rows.append(measure(stage, src, settings, shared))
        if on_row:
            on_row(rows[-1])
    src.keep(set())
    return rows


def machine() -> dict[str, str]:
    import psutil
    import torch

    info = {
        "cpu": platform.processor() or platform.machine(),
        "cores": str(os.cpu_count()),
        "ram_gib": f"{psutil.virtual_memory().total / (1 << 30):.0f}",
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def measured_on(device: str) -> str:
    return "CUDA fp32" if device.startswith("cuda") else "CPU fp32"


HEADER = (
    f"{'stage':<19}{'models':<30}{'time s':>8}{'weights MiB':>12}{'act MiB/item':>13}"
    f"{'peak MiB':>10}  {'batch @24/40/80 GB fp16':<34}note"
)


def format_row(r: Row) -> str:
    batches = "/".join(str(r.batch_fp16[str(g)]) for g in GPU_GIB)
    return (
        f"{r.stage:<19}{r.models:<30}{r.seconds:>8.2f}{r.weights_mib:>12.1f}"
        f"{r.activation_mib_per_item:>13.1f}{r.peak_mib:>10.1f}  "
        f"{batches + ' ' + r.unit:<34}{r.note}"
    )


def footer(config: DoctorConfig, device: str) -> str:
    return (
        f"{config.size} architectures, random weights; {config.resolution} px, "
        f"{config.steps} step(s); batch sizes extrapolated from {measured_on(device)} "
        f"(fp16 = half the measured weights and activations; training: 16 B/parameter; "
        f"10% of the GPU left free)"
    )


def check_json_path(path: Path) -> None:
    """`--json PATH` checked before the stages run (minutes): a folder there, or a file in place of
    a folder above it, is one line naming the flag."""
    if path.is_dir():
        raise OutputError(f"--json {path}: is a folder; give a file path (e.g. {path / 'doctor.json'})")
    for parent in path.parents:
        if parent.is_dir():
            return
        if os.path.lexists(parent):
            raise OutputError(f"--json {path}: {parent} is not a folder; give a file path in a folder")


def write_json(path: Path, rows: Sequence[Row], config: DoctorConfig, device: str, generators: Sequence = ()) -> None:
    settings = {**asdict(config), "tiny_dir": str(config.tiny_dir) if config.tiny_dir else None}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {
                    "machine": machine(),
                    "device": device,
                    "extrapolated_from": measured_on(device),
                    "settings": settings,
                    "rows": [asdict(r) for r in rows],
                    "generators": [asdict(r) for r in generators],
                },
                indent=1,
            )
            + "\n"
        )
    except OSError as err:  # changed while the stages ran, or not writable
        raise OutputError(
            f"--json {path}: cannot write it ({err.strerror or err}); the table above has the same numbers"
        ) from None
