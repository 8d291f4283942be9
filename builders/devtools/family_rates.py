"""The production table's cross-encoder rows (`benchmarks/gpu_check.py`, #51): each family the
report scores (BLIP ITM base and large, BridgeTower large ITM and ITC, ViLT, FLAVA) at its published size
with random weights (builders/devtools/doctor_families.py), scoring image-caption pairs through
the report's adapter (builders/models/cross_encoders.py): ITM pairs/s and the peak GPU memory, in the
dtype the production precision path picks on the device (`precision.worker_precision("auto")`:
fp16 on CUDA; fp32 on the CPU, where `--cpu-tiny` runs the tiny models and the numbers mean
nothing). The cost of a cross-encoder's ITM deltas is pairs x forward passes: three a
counterfactual pair.

`training_rows`: a row per family the trainer finetunes (BLIP ITM base and large, BridgeTower
large ITM, builders/devtools/family_training.py): optimizer steps/s of the family's objective
(training/itm_objectives.py through the trainer's `cross_encoder_step`, then AdamW) at the
recipe's batch (kim2023-blip 16, le2023-bridgetower 128; `TINY_TRAIN_BATCH` with `--cpu-tiny`) and
the step's peak GPU memory, with fp32 weights, gradients and AdamW moments under fp16 autocast on
CUDA (`counterfactory train --mixed-precision fp16`, the doctor's training assumption; no
GradScaler, whose cost is a few elementwise passes); fp32 on the CPU. A batch that does not fit is
a row saying so (BridgeTower's B x B no-grad pass is 16,384 pairs at batch 128).
"""

from __future__ import annotations

import logging
import time

from PIL import Image

from builders.devtools.doctor_families import FAMILY_ROWS, cross_encoder
from builders.devtools.generator_rates import timed
from builders.devtools.stage_rates import free

log = logging.getLogger(__name__)

#: Pairs a forward call at the production shapes (the report's batches are of this order).
PAIRS_A_BATCH = 32
TINY_PAIRS_A_BATCH = 4
TINY_TRAIN_BATCH = 4


def family_rows(cfg, row_type, reset_peak, peak) -> list:
    """A `row_type` (production_rates.Row) per family; one that fails is a row saying why, and
    the others still run (the GPU session is one call). `reset_peak` and `peak` are the table's
    GPU memory probes."""
    from builders.engine.precision import worker_precision

    dtype = worker_precision("auto", cfg.device).dtype
    pairs = TINY_PAIRS_A_BATCH if cfg.tiny else PAIRS_A_BATCH
    rows = []
    for family in FAMILY_ROWS:
        reset_peak(cfg.device)
        start = time.perf_counter()
        try:
            rate, size, g_kind = _rate(family.arch, cfg, dtype, pairs)
            rows.append(
                row_type(
                    f"ITM {family.models}",
                    f"{dtype}, {size}, {pairs} pairs a forward",
                    rate,
                    "pairs/s",
                    peak(cfg.device),
                    time.perf_counter() - start,
                    f"G {g_kind}; 3 forward pairs a counterfactual pair",
                )
            )
        except Exception as err:  # a row per failed family
            log.exception("production table: %s failed", family.stage)
            rows.append(row_type(f"ITM {family.models}", dtype, None, "", note=f"failed: {str(err)[:160]}"))
        free(cfg.device)
    return rows


def _rate(arch: str, cfg, dtype: str, pairs: int) -> tuple[float, str, str]:
    """Pairs/s of `arch` (fastest of 3 calls after a warm-up), the input size of a pair, its G."""
    import numpy as np

    backend = cross_encoder(arch, cfg.tiny_dir, production=not cfg.tiny, device=cfg.device, dtype=dtype)
    rng = np.random.default_rng(0)
    # A COCO photo's size: each processor resizes it as it does a real one.
    images = [Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)) for _ in range(pairs)]
    captions = [f"a photo of {k} dogs next to a cat on a red couch" for k in range(pairs)]
    inputs = backend.inputs(images, captions)
    size = f"{'x'.join(map(str, inputs['pixel_values'].shape[-2:]))} px, {inputs['input_ids'].shape[-1]} tokens"
    seconds = timed(lambda: backend.score(images, captions), cfg.device, repeats=1 if cfg.tiny else 3)
    return pairs / seconds, size, backend.g_kind


def training_rows(cfg, row_type, reset_peak, peak) -> list:
    """A `row_type` per trained family: steps/s at the recipe's batch and the peak GPU memory; a
    failure (out of memory included) is a row saying why, and the others still run."""
    from builders.devtools.family_training import TRAIN_ROWS, recipe_batch

    rows = []
    for family in TRAIN_ROWS:
        recipe = recipe_batch(family.recipe)
        batch = TINY_TRAIN_BATCH if cfg.tiny else recipe
        dtype = "fp16 autocast" if cfg.device.startswith("cuda") else "fp32"
        where = f"{dtype}, batch {batch} ({family.recipe}: {recipe})"
        reset_peak(cfg.device)
        start = time.perf_counter()
        try:
            rate, terms = _train_rate(family.arch, cfg, batch)
            rows.append(
                row_type(
                    f"train {family.models}",
                    where,
                    rate,
                    "steps/s",
                    peak(cfg.device),
                    time.perf_counter() - start,
                    f"{batch * rate:.1f} examples/s; one step: {terms}",
                )
            )
        except Exception as err:  # a row per failed family (out of memory: the batch does not fit)
            log.exception("production table: %s failed", family.stage)
            rows.append(row_type(f"train {family.models}", where, None, "", note=f"failed: {str(err)[:160]}"))
        free(cfg.device)
    return rows


def _train_rate(arch: str, cfg, batch: int) -> tuple[float, str]:
    """Optimizer steps/s of `arch`'s objective (fastest of 3 after a warm-up step) and the terms."""
    from builders.devtools import family_training as ft

    cuda = cfg.device.startswith("cuda")
    scoring = cross_encoder(arch, cfg.tiny_dir, production=not cfg.tiny, device=cfg.device, dtype="fp32")
    backend = ft.training_backend(scoring)
    examples = ft.example_batch(backend, batch, cfg.device)
    optimizer, accelerator = ft.optimizer_for(backend), ft.OneProcess(cfg.device, fp16=cuda)
    seconds = timed(
        lambda: ft.train_step(backend, examples, optimizer, accelerator), cfg.device, repeats=1 if cfg.tiny else 3
    )
    terms = ft.train_step(backend, examples, optimizer, accelerator)
    return 1 / seconds, ", ".join(f"{k} {v:.3f}" for k, v in terms.items())
