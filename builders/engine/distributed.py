"""One interface for "which process am I": a single process, or `accelerate launch` workers.

Builders never branch on how they are launched; they ask this module for the rank and world
size, a barrier and the process's device. Under `accelerate launch` on CPU-only machines the
state must be created with `cpu=True`: accelerate (1.15.0, `PartialState._prepare_backend` in
`accelerate/state.py`) picks its multi-CPU gloo backend only when asked for the CPU, and
otherwise gives every rank a one-process state, so each silently runs the whole job alone. The
world size torchrun announced is checked against what the state reports so that mistake fails
loudly instead of duplicating work.

A job-array worker (`--worker-index i --num-workers n`, or SLURM's array variables) is another
answer to "which process am I" that needs no rendezvous: `array_worker` resolves it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from builders.engine.errors import UserFacingError

log = logging.getLogger(__name__)


@dataclass
class ProcessGroup:
    rank: int
    world_size: int
    barrier: Callable[[], None]
    #: The main process's `value`, returned on every process (a decision all must follow).
    from_main: Callable[[Any], Any] = lambda value: value
    #: Every process's `value`, by rank, returned on every process (what all must agree on).
    all_gather: Callable[[Any], list[Any]] = lambda value: [value]
    # Keeps the accelerate state alive (and its process group) for the run's duration.
    state: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def close(self) -> None:
        """Tear the process group down before the interpreter exits. Left to interpreter shutdown,
        gloo's threads are destroyed in arbitrary order and a process that has finished its work
        can die with SIGABRT ("terminate called without an active exception"). Local: no peer
        is waited for, so it is safe after an error too."""
        if self.state is not None:
            self.state.destroy_process_group()


def launched_world_size() -> int:
    """World size announced by the launcher (torchrun / accelerate), 1 when run directly."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def array_worker(index: int | None, count: int | None, env: Mapping[str, str] = os.environ) -> tuple[int, int] | None:
    """This job-array worker's `(index, count)`: from the flags, else from SLURM's array variables
    (`SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN` of `SLURM_ARRAY_TASK_COUNT`), else None."""
    if (index is None) != (count is None):
        raise UserFacingError(
            "--worker-index and --num-workers go together (give both, or neither inside a SLURM job array)"
        )
    if index is None and "SLURM_ARRAY_TASK_ID" in env:
        try:
            index = int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
            count = int(env["SLURM_ARRAY_TASK_COUNT"])
        except (KeyError, ValueError):
            raise UserFacingError(
                "SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT / "
                "SLURM_ARRAY_TASK_MIN are missing or not integers; pass "
                "--worker-index and --num-workers instead"
            ) from None
        log.info("SLURM job array: worker %d of %d", index, count)
    if index is None or count is None:
        return None
    if count < 1 or not 0 <= index < count:
        raise UserFacingError(
            f"worker index {index} is not in 0..{count - 1} (--num-workers "
            f"{count}); a SLURM array must be a contiguous range such as "
            f"--array=0-{max(count - 1, 0)}"
        )
    return index, count


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
        from_main=_broadcast_from_main,
        all_gather=_gather_to_all,
        state=state,
    )


def _broadcast_from_main(value: Any) -> Any:
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([value], from_process=0)[0]


def _gather_to_all(value: Any) -> list[Any]:
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered
