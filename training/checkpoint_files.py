"""The files of a checkpoint, written and read by the trainer itself, none of them unpickled.

accelerate's `save_state` pickles what `register_for_checkpointing` registers (the scheduler, as
`custom_checkpoint_0.pkl`) and its `load_state` unpickles that with `weights_only=False`: a file
planted in a shared output folder, or a checkpoint received from elsewhere, ran its code on
`--resume` (#32). So the trainer owns the format, one file per piece, each read with a reader
that cannot run code:

| file                 | what                                           | read with               |
|----------------------|------------------------------------------------|-------------------------|
| `model.safetensors`  | the (unwrapped) model's weights                | safetensors             |
| `optimizer.pt`       | `optimizer.state_dict()`                       | torch.load(weights_only=True) |
| `scheduler.json`     | the LambdaLR's state but its lambdas           | json                    |
| `scaler.json`        | the fp16 GradScaler's state (fp16 runs only)   | json                    |
| `rng_state_I.json`   | process I's Python, numpy and torch RNG states | json                    |
| `trainer_state.json` | epoch, batch, step (training/checkpoint.py)    | json, written last      |

The optimizer's state dict is tensors, numbers, booleans, tuples and dicts: exactly what torch's
weights_only unpickler accepts (it refuses any other global, so a `__reduce__` payload cannot
run), and torch's own format for it; recasting it as safetensors + JSON would re-implement that
format for each optimizer. Everything else is JSON, checked against the live object's own state
(same keys, same kinds of values) before it is applied.

A folder holding any other file (accelerate's pickles `custom_checkpoint_0.pkl`,
`random_states_0.pkl`, `optimizer.bin`, ... from older versions, or a planted file), a symlink
or a sub-folder is refused in one line naming it before anything in it is read.
"""

from __future__ import annotations

import json
import logging
import pickle
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from builders.engine.errors import InputFileError
from builders.models.pickled_weights import refused_global

log = logging.getLogger(__name__)
MODEL, OPTIMIZER, SCHEDULER, SCALER = "model.safetensors", "optimizer.pt", "scheduler.json", "scaler.json"
RNG = re.compile(r"rng_state_(\d+)\.json")
#: The files of a checkpoint besides the RNG states (`trainer_state.json`: training/checkpoint.py).
CHECKPOINT_FILES = {MODEL, OPTIMIZER, SCHEDULER, SCALER, "trainer_state.json"}
#: safetensors writes the model through a temporary sibling (Rust's `tempfile`: ".tmp" and 6
#: characters) renamed over it: a save killed midway leaves one (found in a kill test, #51).
SAVE_TMP = re.compile(r"\.tmp[A-Za-z0-9]{6}")


def written_by_trainer(name: str) -> bool:
    """Whether a checkpoint's file `name` is one the trainer writes there, whole or interrupted:
    an interrupted save is deleted as the trainer's own, anything else is refused."""
    return (
        name in CHECKPOINT_FILES
        or name == "trainer_state.json.tmp"
        or RNG.fullmatch(name) is not None
        or SAVE_TMP.fullmatch(name) is not None
    )


RESUME_FIX = "resume from a checkpoint this version of `counterfactory train` wrote, or start again without --resume"


@dataclass
class Resumable:
    """What a checkpoint restores besides the trainer's counters."""

    #: The unwrapped model (not its DDP wrapper): the same parameters on every process.
    model: torch.nn.Module
    optimizer: Any
    scheduler: torch.optim.lr_scheduler.LRScheduler
    #: accelerate's GradScaler under fp16, else None.
    scaler: Any = None


def write_shared(folder: Path, pieces: Resumable) -> None:
    """The pieces every process holds alike (main process only)."""
    from safetensors.torch import save_model

    save_model(pieces.model, str(folder / MODEL))
    torch.save(pieces.optimizer.state_dict(), folder / OPTIMIZER)
    (folder / SCHEDULER).write_text(json.dumps(_scheduler_state(pieces.scheduler)))
    if pieces.scaler is not None:
        (folder / SCALER).write_text(json.dumps(pieces.scaler.state_dict()))


def write_rng(folder: Path, process_index: int) -> None:
    """This process's RNG states (each process its own file)."""
    state = {
        "python": random.getstate(),
        "numpy": _numpy_rng(np.random.get_state()),
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    (folder / f"rng_state_{process_index}.json").write_text(json.dumps(state))


def check_files(folder: Path, fp16: bool) -> None:
    """Refuse a folder that is not exactly a checkpoint of this format, before reading any of
    it: a file we would not read may be a pickle meant for a reader that unpickles."""
    for entry in sorted(folder.iterdir()):
        if entry.is_symlink() or not entry.is_file():
            raise InputFileError(
                entry, "--resume: a checkpoint holds only plain files, this is a symlink or a folder", RESUME_FIX
            )
        if entry.name not in CHECKPOINT_FILES and not RNG.fullmatch(entry.name):
            raise InputFileError(
                entry,
                "--resume: not a file this trainer writes into a checkpoint (a pickle of "
                "accelerate's older checkpoint format, or a file put there), so the "
                "checkpoint is refused without opening it",
                RESUME_FIX,
            )
    needed = [MODEL, OPTIMIZER, SCHEDULER, *([SCALER] if fp16 else [])]
    missing = [name for name in needed if not (folder / name).is_file()]
    if missing:
        raise InputFileError(
            folder,
            f"--resume: not a complete checkpoint, no {', '.join(missing)}",
            "give a checkpoint folder OUTPUT/checkpoints/step-N that `counterfactory train` wrote, or `latest`",
        )


def read_all(folder: Path, pieces: Resumable, process_index: int) -> None:
    """Restore every piece from `folder` (already through `check_files`)."""
    _load_model(folder / MODEL, pieces.model)
    _load_optimizer(folder / OPTIMIZER, pieces.optimizer)
    pieces.scheduler.load_state_dict(
        {
            **_json_state(folder / SCHEDULER, _scheduler_state(pieces.scheduler)),
            "lr_lambdas": [None] * len(pieces.scheduler.lr_lambdas),
        }
    )
    if pieces.scaler is not None:
        pieces.scaler.load_state_dict(_json_state(folder / SCALER, pieces.scaler.state_dict()))
    _load_rng(folder, process_index)


def _scheduler_state(scheduler) -> dict:
    # LambdaLR's lambdas are functions (`None` in its state dict): the run's flags rebuild them.
    return {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}


def _load_model(path: Path, model: torch.nn.Module) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    try:
        load_model(model, str(path), strict=True, device=str(next(model.parameters()).device))
    except (SafetensorError, RuntimeError, OSError, ValueError) as err:
        raise InputFileError(
            path,
            f"--resume: not this run's model weights ({_first_line(err)})",
            "resume with the --model and --backend of the run that wrote it",
        ) from None


def _load_optimizer(path: Path, optimizer) -> None:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise InputFileError(
            path,
            f"--resume: not an optimizer state: it holds {refused_global(err)}, "
            "which torch's weights_only loading refused, so none of it ran",
            RESUME_FIX,
        ) from None
    except (RuntimeError, OSError, EOFError) as err:
        raise InputFileError(
            path, f"--resume: not an optimizer state torch can read ({_first_line(err)})", RESUME_FIX
        ) from None
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, TypeError) as err:
        raise InputFileError(
            path,
            f"--resume: not this run's optimizer state ({_first_line(err)})",
            "resume with the flags of the run that wrote it",
        ) from None


def _json_state(path: Path, live: dict) -> dict:
    """A JSON state checked against the live object's: no key it lacks, every public key there,
    each value of the same kind (so no state can set another attribute or type)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputFileError(path, f"--resume: unreadable ({_first_line(err)})", RESUME_FIX) from None
    bad = (
        "not a JSON object"
        if not isinstance(saved, dict)
        else next((f"unexpected key {k!r}" for k in saved if k not in live), None)
        or next((f"no {k!r}" for k in live if not k.startswith("_") and k not in saved), None)
        or next((f"{k!r} is {saved[k]!r}" for k in saved if not _same_kind(live[k], saved[k])), None)
    )
    if bad:
        raise InputFileError(path, f"--resume: not this run's state ({bad})", RESUME_FIX)
    return saved


def _same_kind(live: Any, saved: Any) -> bool:
    if isinstance(live, bool) or isinstance(saved, bool):
        return isinstance(live, bool) and isinstance(saved, bool)
    if isinstance(live, (int, float)) or live is None:
        return isinstance(saved, (int, float)) or saved is None
    if isinstance(live, (list, tuple)):
        return (
            isinstance(saved, list)
            and len(saved) == len(live)
            and all(_same_kind(a, b) for a, b in zip(live, saved, strict=True))
        )
    return type(live) is type(saved)


def _numpy_rng(state: tuple) -> list:
    kind, keys, pos, has_gauss, cached = state
    return [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]


def _load_rng(folder: Path, process_index: int) -> None:
    """Every process checks every process's RNG file (so all fail together, none waits at a
    collective for one that failed) and applies its own. A process the saving run did not have
    (resumed on more processes) keeps its seeded state: the batch order depends on the seed and
    epoch only, the RNG only on dropout and worker seeds."""
    states = {}
    for path in sorted(folder.glob("rng_state_*.json")):
        try:
            states[int(RNG.fullmatch(path.name).group(1))] = _rng_setters(json.loads(path.read_text()))
        except (
            OSError,
            UnicodeDecodeError,
            json.JSONDecodeError,
            TypeError,
            ValueError,
            KeyError,
            IndexError,
            RuntimeError,
            OverflowError,
        ) as err:
            raise InputFileError(path, f"--resume: not an RNG state ({_first_line(err)})", RESUME_FIX) from None
    if process_index not in states:
        log.warning(
            "--resume: %s has no RNG state of process %d (saved on fewer processes); it keeps its seeded RNG",
            folder,
            process_index,
        )
        return
    for apply in states[process_index]:
        apply()


def _rng_setters(state: dict) -> list:
    """Setters of a saved RNG state, each tried on a throw-away generator first (a malformed
    state raises here, before any global generator is touched)."""
    version, internal, gauss = state["python"]
    py = (int(version), tuple(int(x) for x in internal), None if gauss is None else float(gauss))
    random.Random().setstate(py)
    kind, keys, pos, has_gauss, cached = state["numpy"]
    npy = (str(kind), np.array(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached))
    np.random.RandomState().set_state(npy)
    cpu = _byte_tensor(state["torch"])
    torch.Generator().set_state(cpu)
    setters = [lambda: random.setstate(py), lambda: np.random.set_state(npy), lambda: torch.set_rng_state(cpu)]
    if torch.cuda.is_available() and "cuda" in state:
        cuda = [_byte_tensor(s) for s in state["cuda"]][: torch.cuda.device_count()]
        setters.append(lambda: torch.cuda.set_rng_state_all(cuda))
    return setters


def _byte_tensor(values: list) -> torch.Tensor:
    if not isinstance(values, list) or not all(isinstance(v, int) and 0 <= v < 256 for v in values):
        raise ValueError("a torch RNG state is a list of bytes")
    return torch.tensor(values, dtype=torch.uint8)


def _first_line(err: Exception) -> str:
    return " ".join(str(err).split())[:200] or type(err).__name__
