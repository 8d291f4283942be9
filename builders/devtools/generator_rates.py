"""Timing and memory checks shared by the production table (`benchmarks/gpu_check.py`,
builders/devtools/production_rates.py): `timed`, the fastest of a few synchronised calls, and
`fits`, whether a generator's denoiser and a batch fit the device (the doctor's meta-device
arithmetic), so a generator that cannot run is a row with the reason rather than an
out-of-memory error.
"""

from __future__ import annotations

import time

from builders.devtools.doctor_generators import SHAPES, activations_meta, parameter_counts

GIB = 1 << 30
HEADROOM = 0.9


def device_memory(device: str) -> int:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_properties(device).total_memory
    import psutil

    return psutil.virtual_memory().available


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
