"""One interface for "which process am I": a single process, or `accelerate launch` workers.

Builders never branch on how they are launched; they ask this module for the rank and world
size, a barrier and the process's device. Under `accelerate launch` on CPU-only machines the
state must be created with `cpu=True`: accelerate (1.15.0, `PartialState._prepare_backend` in
`accelerate/state.py`) picks its multi-CPU gloo backend only when asked for the CPU, and
otherwise gives every rank a one-process state, so each silently runs the whole job alone. The
world size torchrun announced is checked against what the state reports so that mistake fails
loudly instead of duplicating work.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

from builders.engine.errors import UserFacingError

log = logging.getLogger(__name__)


@dataclass
class ProcessGroup:
    rank: int
    world_size: int
    barrier: Callable[[], None]
    # Keeps the accelerate state alive (and its process group) for the run's duration.
    state: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_world_size() -> int:
    """World size announced by the launcher (torchrun / accelerate), 1 when run directly."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def worker_device() -> str:
    """This process's device, the one place that decides it: its own GPU under `accelerate
    launch` (`LOCAL_RANK`), else the CPU. Models are moved there once, when loaded."""
    import torch

    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return "cpu"


def init_process_group(expect_processes: int | None = None) -> ProcessGroup:
    """Join the launcher's process group (if any) and check the process count."""
    announced = launched_world_size()
    if announced == 1 and expect_processes in (None, 1):
        return ProcessGroup(rank=0, world_size=1, barrier=lambda: None)

    import torch
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())
    if state.num_processes != announced:
        raise UserFacingError(
            f"the launcher started {announced} processes but accelerate sees {state.num_processes}; "
            "on CPU use `accelerate launch --multi_gpu --num_processes N --num_machines 1 "
            "--mixed_precision no --dynamo_backend no SCRIPT` (not `--cpu`, which runs one process)"
        )
    if expect_processes is not None and state.num_processes != expect_processes:
        raise UserFacingError(
            f"--expect-processes {expect_processes} but this run has {state.num_processes} "
            "process(es); check the launcher flags (`--cpu` with accelerate runs a single process)"
        )
    log.info("process %d of %d (%s)", state.process_index, state.num_processes, state.device)
    return ProcessGroup(
        rank=state.process_index,
        world_size=state.num_processes,
        barrier=state.wait_for_everyone,
        state=state,
    )
