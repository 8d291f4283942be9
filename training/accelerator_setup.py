"""The run's `accelerate.Accelerator`: its device and mixed precision, checked before anything is
written (fp16 on the CPU is refused, not silently run in fp32), its trackers (`--report-to`), and
the process count the user expected (`--expect-processes`)."""

from __future__ import annotations

from pathlib import Path

import torch

from builders.engine.errors import UserFacingError
from builders.engine.precision import resolve_dtype
from training.config import TrainConfig


def check_mixed_precision(mode: str, device: str, bf16_supported=None) -> None:
    """Refuse a `--mixed-precision` the device cannot run (fp16 on the CPU, bf16 on a GPU
    without it) instead of letting accelerate run something else than what was asked."""
    if mode != "no":
        resolve_dtype(mode, device, bf16_supported, flag="--mixed-precision", full="no")


def make_accelerator(cfg: TrainConfig, output: Path):
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    trackers = _trackers(cfg.run.report_to)
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),
        mixed_precision=cfg.optim.mixed_precision,
        log_with=trackers,
        project_config=ProjectConfiguration(project_dir=str(output), logging_dir=str(output / "logs")),
    )
    expected = cfg.run.expect_processes
    if expected is not None and accelerator.num_processes != expected:
        raise UserFacingError(
            f"--expect-processes {expected} but {accelerator.num_processes} process(es) started; on "
            "CPU use `accelerate launch --multi_gpu --num_processes N --num_machines 1 ...` "
            "(`--cpu --num_processes N` starts one)"
        )
    return accelerator


def _trackers(report_to: str) -> list[str] | None:
    """accelerate's trackers of `--report-to`: each an optional package, checked before the run
    (`auto`: TensorBoard when installed, else none)."""
    import importlib.util

    if report_to == "none":
        return None
    installed = importlib.util.find_spec(report_to if report_to != "auto" else "tensorboard")
    if report_to == "auto":
        return ["tensorboard"] if installed else None
    if not installed:
        raise UserFacingError(
            f"--report-to {report_to} needs the {report_to} package: `pip install {report_to}`, or --report-to none"
        )
    return [report_to]
