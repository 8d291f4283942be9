"""The samplers of the image stage's denoising loops (builders/counterfactuals/METHOD.md §2):
which scheduler a run names, its prediction of the clean latents for early rejection, and its
per-row history when candidates leave the batch."""

from __future__ import annotations

import torch

SCHEDULERS = ("euler_ancestral", "dpm_solver_pp", "pipeline")


def make_scheduler(pipe, kind: str):
    """A fresh scheduler (schedulers keep per-run state). `euler_ancestral` is the reference's
    sampler; `dpm_solver_pp` is DPM-Solver++ (2M), a multistep solver meant for ~25 steps (an
    approximation: other images than the reference sampler's); `pipeline` keeps the pipeline's
    own scheduler class."""
    if kind == "euler_ancestral":
        from diffusers import EulerAncestralDiscreteScheduler

        return EulerAncestralDiscreteScheduler.from_config(pipe.scheduler.config)
    if kind == "dpm_solver_pp":
        from diffusers import DPMSolverMultistepScheduler

        return DPMSolverMultistepScheduler.from_config(
            pipe.scheduler.config, algorithm_type="dpmsolver++", solver_order=2
        )
    if kind == "pipeline":
        return type(pipe.scheduler).from_config(pipe.scheduler.config)
    raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {kind!r}")


def predicted_x0(sched, out) -> torch.Tensor:
    """The sampler's x0 prediction of the step it just took: Euler-type samplers return it,
    DPM-Solver++ keeps it as its newest model output."""
    x0 = getattr(out, "pred_original_sample", None)
    if x0 is None and getattr(sched, "model_outputs", None) and sched.model_outputs[-1] is not None:
        x0 = sched.model_outputs[-1]
    if x0 is None:
        raise ValueError(
            f"early rejection needs a sampler that predicts x0 "
            f"(euler_ancestral, dpm_solver_pp), not {type(sched).__name__}"
        )
    return x0


def keep_sampler_rows(sched, rows: list[int]) -> None:
    """Drop the per-row history of a multistep sampler along with the rows themselves."""
    if getattr(sched, "model_outputs", None):
        sched.model_outputs = [m[rows] if isinstance(m, torch.Tensor) else m for m in sched.model_outputs]
