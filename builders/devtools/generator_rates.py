"""Denoiser throughput per image-stage generator (`benchmarks/gpu_check.py`): one denoising step
of a batch of candidate pairs, every guidance half included, through each generator's denoiser
at its production shape (sd15 at 512 px; sdxl, sd3, flux at 1024 px) with random weights, in the
dtype it runs in (fp16; bf16 for FLUX).

Random weights: the architecture is the published one (`production_generators`), built on the
meta device and materialised on the GPU with normal(0, 0.02) values, so no checkpoint is read and
no fp32 copy of a 12B model passes through host memory. The work of a forward depends on the
shapes, not on the values. Only the denoiser runs: text encoding (once per caption pair) and the
VAE decode (once per pair) are outside the per-step figure.

A generator whose denoiser weights plus the activations of the batch (the doctor's meta-device
arithmetic) exceed 90% of the device's memory is skipped, with the reason printed.

`tiny=True` runs the same code on small configs of the same families at 64 px (the CPU check
of tests/devtools/test_doctor.py: its numbers mean nothing).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

from builders.devtools.doctor_generators import (
    SHAPES,
    activations_meta,
    components,
    denoiser_inputs,
    parameter_counts,
    torch_dtype,
)

log = logging.getLogger(__name__)

GIB = 1 << 30
HEADROOM = 0.9
TINY_SIDE = 64
#: Config overrides of each denoiser for `tiny=True`: the same classes, a few channels deep.
TINY = {
    "sd15": {
        "block_out_channels": [32, 32, 64, 64],
        "layers_per_block": 1,
        "attention_head_dim": 4,
        "cross_attention_dim": 32,
        "norm_num_groups": 8,
    },
    "sdxl": {
        "block_out_channels": [32, 64, 64],
        "layers_per_block": 1,
        "attention_head_dim": [2, 4, 4],
        "transformer_layers_per_block": [1, 1, 1],
        "cross_attention_dim": 32,
        "norm_num_groups": 8,
        "addition_time_embed_dim": 8,
        "projection_class_embeddings_input_dim": 32 + 6 * 8,
    },
    "sd3": {
        "num_layers": 2,
        "attention_head_dim": 8,
        "num_attention_heads": 2,
        "joint_attention_dim": 32,
        "caption_projection_dim": 16,
        "pooled_projection_dim": 16,
    },
    "flux": {
        "num_layers": 1,
        "num_single_layers": 1,
        "attention_head_dim": 16,
        "num_attention_heads": 2,
        "joint_attention_dim": 32,
        "pooled_projection_dim": 16,
        "axes_dims_rope": [4, 6, 6],
    },
}


@dataclass
class GeneratorRate:
    generator: str
    dtype: str
    resolution: int
    #: Rows of one forward: `pairs` x the generator's rows per pair.
    rows: int
    rows_per_s: float = 0.0
    #: Pair-steps per second (one denoising step of one candidate pair, all its rows).
    pair_steps_per_s: float = 0.0
    #: Candidate pairs per second at the model's default steps (denoiser only).
    pairs_per_s: float = 0.0
    steps: int = 0
    peak_gib: float = 0.0
    #: Why it did not run (empty when it ran).
    skipped: str = ""


def _device_memory(device: str) -> int:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_properties(device).total_memory
    import psutil

    return psutil.virtual_memory().available


def _random_denoiser(generator: str, device: str, dtype, tiny: bool):
    """The denoiser with normal(0, 0.02) weights made on `device` (no host copy)."""
    import torch

    from builders.models.production_configs import build_empty

    arch = components(generator)[0]
    if tiny:
        arch = dataclasses.replace(arch, config={**arch.config, **TINY[generator]})
    model = torch.nn.Module.to(build_empty(arch), dtype).to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
        for b in model.buffers():  # positional tables: their values do not change the work
            b.zero_()
    return model.eval()


def timed(fn, device: str, repeats: int) -> float:
    """Fastest of `repeats` calls after one warm-up, the device synchronised around each."""
    import torch

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    fn()
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def fits(generator: str, device: str, dtype: str, pairs: int, memory: int) -> str:
    """'' when the denoiser in `dtype` and a batch of `pairs` fit 90% of `memory` bytes, else the
    reason (the activations are the doctor's, at the run dtype: x2 for fp32)."""
    shape = SHAPES[generator]
    scale = 2 if dtype == "fp32" else 1
    need = scale * (parameter_counts(generator)[0] * 2 + pairs * activations_meta(generator)[0])
    if need <= HEADROOM * memory:
        return ""
    return (
        f"needs {need / GIB:.1f} GiB ({dtype} denoiser + {pairs} pairs' activations at "
        f"{shape.resolution} px), over 90% of the {memory / GIB:.1f} GiB of {device}"
    )


def generator_rate(
    generator: str, device: str, *, pairs: int = 2, repeats: int = 3, tiny: bool = False, memory: int | None = None
) -> GeneratorRate:
    import torch

    shape = SHAPES[generator]
    cuda = device.startswith("cuda")
    dtype_name = shape.dtype if cuda else "fp32"  # CPUs lack fast fp16/bf16 kernels
    side = TINY_SIDE if tiny else shape.resolution
    rate = GeneratorRate(generator, dtype_name, side, pairs * shape.rows_per_pair, steps=shape.steps)
    if not tiny:
        rate.skipped = fits(generator, device, dtype_name, pairs, _device_memory(device) if memory is None else memory)
        if rate.skipped:
            return rate
    dtype = torch_dtype(dtype_name)
    if cuda:
        torch.cuda.empty_cache()  # the previous generator's blocks
        torch.cuda.reset_peak_memory_stats(device)
    model = _random_denoiser(generator, device, dtype, tiny)
    inputs = denoiser_inputs(model, rate.rows, side, device, dtype)
    with torch.no_grad():
        seconds = timed(lambda: model(**inputs), device, repeats)
    rate.rows_per_s = rate.rows / seconds
    rate.pair_steps_per_s = pairs / seconds
    rate.pairs_per_s = rate.pair_steps_per_s / shape.steps
    if cuda:
        rate.peak_gib = torch.cuda.max_memory_allocated(device) / GIB
    return rate
