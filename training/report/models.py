"""The models a benchmark scores: what `--model` says, loaded by the trainer's backends."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from builders.engine.errors import UserFacingError
from builders.models.clip_ids import OPEN_CLIP, OPEN_CLIP_PREFIXES, TRANSFORMERS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSpec:
    """One `--model`: a Hugging Face CLIP id or save_pretrained folder (transformers), or an
    open_clip model: `open_clip:ARCH:TAG`, `hf-hub:ID`, `local-dir:PATH` or an open_clip folder
    (a training run's final/ of `--backend open_clip`)."""

    name: str  # as given on the command line
    backend: str
    model_id: str  # what training.backends.load_backend reads
    pretrained: str | None = None


def parse_model(name: str) -> ModelSpec:
    if name.startswith(OPEN_CLIP_PREFIXES):
        model_id = name.removeprefix("open_clip:")
        named_weights = model_id.startswith(("hf-hub:", "local-dir:"))
        tag = None if named_weights else model_id.partition(":")[2] or None
        return ModelSpec(name, OPEN_CLIP, model_id, tag)
    if (Path(name) / "open_clip_config.json").is_file():
        return ModelSpec(name, OPEN_CLIP, f"local-dir:{name}")
    return ModelSpec(name, TRANSFORMERS, name)


def load_model(spec: ModelSpec):
    """The trainer's backend of `spec`; a model that cannot be loaded is one line naming it."""
    from training.backends import load_backend

    try:
        return load_backend(spec.backend, spec.model_id)
    except Exception as err:  # noqa: BLE001 - any loader failure means the same to the user
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise UserFacingError(
            f"--model {spec.name}: cannot load it as a CLIP model ({first}); give a Hugging Face "
            "CLIP id, a save_pretrained or open_clip folder (a training run's final/), or "
            "open_clip:ARCH:TAG") from None


def weights_digest(module: torch.nn.Module) -> str:
    """sha256 of the weights (names, shapes, dtypes and bytes): which weights were scored, however
    they were named or stored."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return f"sha256:{h.hexdigest()}"
