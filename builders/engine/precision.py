"""The floating-point precision of the builders' model stages: one resolution, next to the device.

`--dtype auto` (default) is fp16 on CUDA, the precision the reference generators (Stable
Diffusion, CLIP) run in, at half the memory and about twice the throughput of fp32, or the
model's own reference dtype where a caller names one (`auto_cuda`: bf16 for FLUX.1 and SD3.5, as
their cards run them); on any other device it is fp32, so CPU builds keep their exact outputs.
bf16 counts only where the GPU has it natively (`torch.cuda.is_bf16_supported(
including_emulation=False)`: torch's default answer also counts the slow emulation of a V100 or
T4). Where it lacks it, `auto` falls back to fp16, as diffusers runs FLUX in fp16 (clamping its
activations) and Stable Flow's code runs it, not fp32, in which FLUX's 12B transformer alone
needs ~48 GB that no pre-Ampere card holds; the fallback is logged in one line and recorded
(`Precision.fallback`). fp16 is refused on the CPU (PyTorch's CPU half kernels are missing for
some ops and far slower than fp32 for the rest), `--dtype bf16` where the GPU lacks it natively,
each with one line naming the way out.

The resolved `Precision` is part of a build's config (`as_config`): it is recorded in the
manifest and the card, and a resume with another device type or dtype is refused like any other
config change, so parts made in different precisions are never mixed.

Example:
    >>> resolve_dtype("auto", "cuda:1"), resolve_dtype("auto", "cpu")
    ('fp16', 'fp32')
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict, dataclass
from typing import Any, Callable

from builders.engine.errors import UserFacingError
from builders.engine.options import option

#: `--dtype` choices; `auto` resolves per device (`resolve_dtype`).
DTYPE_CHOICES = ("auto", "fp32", "fp16", "bf16")

log = logging.getLogger(__name__)


def device_type(device: str) -> str:
    """`cuda:1` -> `cuda`: what precision (and bitwise reproducibility) depends on."""
    return str(device).split(":", 1)[0]


def resolve_dtype(
    requested: str,
    device: str,
    bf16_supported: Callable[[], bool] | None = None,
    flag: str = "--dtype",
    full: str = "fp32",
    auto_cuda: str = "fp16",
) -> str:
    """The dtype name (`fp32`, `fp16`, `bf16`) that `requested` means on `device`; raises a
    `UserFacingError` for a precision the device cannot run, naming `flag` and its full-precision
    value `full`. `auto` is `auto_cuda` on CUDA (where that is bf16 and the GPU lacks it
    natively: fp16, logged), fp32 elsewhere. `bf16_supported` defaults to `native_bf16` (a
    parameter so the table is testable without a GPU)."""
    return _resolve(requested, device, bf16_supported, flag, full, auto_cuda)[0]


def _resolve(
    requested: str,
    device: str,
    bf16_supported: Callable[[], bool] | None,
    flag: str,
    full: str,
    auto_cuda: str,
) -> tuple[str, str | None]:
    """`resolve_dtype`'s dtype and, where `auto` could not run `auto_cuda`, why (else None)."""
    if requested not in DTYPE_CHOICES:
        raise UserFacingError(f"{flag} takes {', '.join(DTYPE_CHOICES)} (got {requested!r})")
    kind = device_type(device)
    if requested == "auto":
        if kind != "cuda":
            return "fp32", None
        if auto_cuda == "bf16" and not _bf16(bf16_supported):
            why = (
                f"{flag} auto: this GPU ({device}) lacks native bfloat16, the model's reference dtype "
                "(torch.cuda.is_bf16_supported(including_emulation=False) is False); running in fp16, "
                "as diffusers and Stable Flow run FLUX.1 on such GPUs"
            )
            log.info("%s", why)
            return "fp16", why
        return auto_cuda, None
    if requested == "fp16" and kind == "cpu":
        raise UserFacingError(
            f"{flag} fp16 needs a GPU (this process runs on the CPU, whose half "
            f"kernels are incomplete and slow); use {flag} {full} or {flag} bf16"
        )
    if requested == "bf16" and kind == "cuda":
        if not _bf16(bf16_supported):
            raise UserFacingError(
                f"{flag} bf16: this GPU ({device}) has no native bfloat16 "
                f"(torch.cuda.is_bf16_supported(including_emulation=False) is False); use {flag} fp16"
            )
    return requested, None


def native_bf16() -> bool:
    """Whether this process's GPU runs bfloat16 natively (Ampere and later), not emulated."""
    import torch

    return bool(torch.cuda.is_bf16_supported(including_emulation=False))


def _bf16(supported: Callable[[], bool] | None) -> bool:
    return bool((supported or native_bf16)())


def torch_dtype(name: str) -> Any:
    """The torch dtype of a resolved dtype name."""
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


@dataclass(frozen=True)
class Precision:
    """Where and in what precision a build's model stages run (resolved once per process)."""

    device: str
    dtype: str
    #: Why `--dtype auto` runs another dtype than the model's reference one (None: it does not).
    fallback: str | None = None

    @classmethod
    def resolve(cls, requested: str, device: str, auto_cuda: str = "fp16") -> "Precision":
        dtype, fallback = _resolve(requested, device, None, "--dtype", "fp32", auto_cuda)
        return cls(device=device, dtype=dtype, fallback=fallback)

    @property
    def torch_dtype(self) -> Any:
        return torch_dtype(self.dtype)

    def as_config(self) -> dict[str, str]:
        """What the manifest, the card and the resume check record: the device type (not its
        index: workers on different GPUs make the same rows), the dtype, and a fallback's reason
        where there is one."""
        record = {**asdict(self), "device": device_type(self.device)}
        if self.fallback is None:
            del record["fallback"]  # the records of builds without one stay as they were
        return record


def worker_precision(requested: str = "auto", device: str | None = None, auto_cuda: str = "fp16") -> Precision:
    """This process's `Precision`: `device` (default `distributed.worker_device`, the one place
    that picks the device) and `requested` resolved on it (`auto_cuda`: `resolve_dtype`)."""
    from builders.engine.distributed import worker_device

    return Precision.resolve(requested, device or worker_device(), auto_cuda)


def _dtype_help(stages: str, cuda: str = "fp16") -> str:
    return (
        f"precision of {stages} (default %(default)s: {cuda} on CUDA, fp32 elsewhere; fp16 is "
        "refused on the CPU, bf16 on GPUs without it)"
    )


def dtype_option(stages: str, group: str | None = None, cuda: str = "fp16") -> Any:
    """The `--dtype` field of a builder's config (`builders.engine.options`), whose `stages`
    (words for its help) run in the chosen precision; `cuda`: what `auto` is on CUDA, in words."""
    return option("auto", _dtype_help(stages, cuda), group=group, choices=DTYPE_CHOICES)


def add_dtype_argument(group: argparse._ActionsContainer, stages: str) -> None:
    """`--dtype` for a command that has no config of its own (`counterfactory eccv ...`)."""
    group.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help=_dtype_help(stages))
