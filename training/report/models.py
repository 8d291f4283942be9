"""The models a benchmark scores: what `--model` says, loaded by the trainer's backends."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import torch

from builders.engine.errors import UserFacingError
from builders.models.clip_ids import ClipId
from builders.models.families import ModelFamily, named_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSpec:
    """One `--model`: a Hugging Face CLIP id or save_pretrained folder (transformers), or an
    open_clip model: `open_clip:ARCH:TAG`, `hf-hub:ID`, `local-dir:PATH` or an open_clip folder
    (a training run's final/ of `--backend open_clip`)."""

    name: str  # as given on the command line
    backend: str  # transformers, open_clip, or text-only (the blind baseline's models)
    #: What training.backends.load_backend loads; None for a text-only model.
    clip: ClipId | None = None
    #: Its family and head (builders/models/families.py); None for a text-only model.
    family: ModelFamily | None = None

    @property
    def pretrained(self) -> str | None:
        """open_clip's weights tag of an architecture name."""
        return self.clip.pretrained if self.clip else None


def parse_model(name: str, flag: str = "--model") -> ModelSpec:
    """`name` (given as `flag`) parsed once, before any dataset is opened (`families.named_model`)."""
    clip, family = named_model(name, flag)
    return ModelSpec(name, clip.backend, clip, family)


def model_origin(name: str) -> str:
    """Where the model `--model name` came from, for the report's readers (the records name it by
    its contents, `provenance.model_name`, which for a local folder says only `local:NAME@sha256`):
    a training run's `final/` or `best/` is "finetuned from BASE for N steps (run folder RUN)" as
    the run's `run.json` records them; a folder of `counterfactory models tiny` is "tiny
    random-init ROLE"; anything else (a Hub id, another folder) is its provenance name."""
    from builders.engine.provenance import model_name
    from builders.models.tiny import DONE

    folder = Path(name.removeprefix("local-dir:"))
    run = folder.parent / "run.json"
    if folder.is_dir() and run.is_file():
        try:
            record = json.loads(run.read_text())
            base, steps = record["config"]["run"]["model"], record.get("steps")
        except (OSError, ValueError, KeyError, TypeError):
            return model_name(name)  # not a run record this trainer wrote
        during = f" for {steps} steps" if isinstance(steps, int) else ""
        return f"finetuned from {base}{during} (run folder {folder.parent.name}, its {folder.name}/)"
    if folder.is_dir() and (folder.parent / DONE).is_file():
        return f"tiny random-init {folder.name} (counterfactory models tiny)"
    return model_name(name)


def load_model(spec: ModelSpec, trust_pickled_weights: bool = False):
    """The trainer's backend of `spec`; a model that cannot be loaded is one line naming it.
    Pickled weights load only with `trust_pickled_weights` (builders.models.pickled_weights)."""
    from builders.models.pickled_weights import PickledWeightsError, trusting_pickled_weights
    from training.backends import load_backend

    try:
        with trusting_pickled_weights(trust_pickled_weights):
            if not spec.family.dual_encoder:
                from builders.models.cross_encoders import load_cross_encoder

                return load_cross_encoder(spec.clip, spec.family.architecture)
            return load_backend(spec.clip)
    except PickledWeightsError:
        raise  # already names the weight file and --trust-pickled-weights
    except Exception as err:  # noqa: BLE001 - any loader failure means the same to the user
        if not spec.family.dual_encoder:
            raise UserFacingError(
                f"--model {spec.name}: cannot load it as {spec.family.architecture} ({_sentence(err)})"
            ) from None
        raise UserFacingError(
            f"--model {spec.name}: cannot load it as a CLIP model ({_sentence(err)}); give a Hugging Face "
            "CLIP id, a save_pretrained or open_clip folder (a training run's final/), or "
            "open_clip:ARCH:TAG"
        ) from None


def _sentence(err: Exception, limit: int = 600) -> str:
    """A loader's message on one line, whole (the loaders' own messages end with their advice);
    a longer one is cut at a word and marked, never mid-sentence without a sign."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " [...]"


def weights_digest(module: torch.nn.Module) -> str:
    """sha256 of the weights (names, shapes, dtypes and bytes): which weights were scored, however
    they were named or stored."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return f"sha256:{h.hexdigest()}"


#: Captions whose token ids fingerprint a tokenizer (vocabulary, casing, context length: the
#: second is longer than CLIP's 77 tokens).
PROBE_CAPTIONS = ["A photo of a cat sitting on a red sofa.", "Two DOGS, 3 frisbees & an uber-long caption; " * 12]


def _step(step) -> dict:
    """A resize/crop step by its class and plain settings (a repr may hold a memory address)."""
    plain = (int, float, str, bool, tuple, list, type(None), Enum)
    return {
        "step": getattr(step, "__qualname__", type(step).__qualname__),
        **{
            k: repr(v)
            for k, v in sorted(getattr(step, "__dict__", {}).items())
            if not k.startswith("_") and isinstance(v, plain)
        },
    }


def preprocessing_digest(backend) -> str:
    """sha256 of what turns an image and a caption into the model's inputs, which the weights
    digest does not cover: the pixel pipeline (size, mean, std, each resize/crop step's settings)
    and the tokenizer's ids of `PROBE_CAPTIONS` (a cross-encoder's: its processor's,
    builders/models/cross_encoders.py)."""
    if not backend.dual_encoder:
        from builders.models.cross_encoders import preprocessing_digest as pairs_digest

        return pairs_digest(backend, PROBE_CAPTIONS)
    p = backend.pixels
    tokens = backend.tokenize(PROBE_CAPTIONS)
    desc = {
        "size": p.size,
        "mean": list(p.mean),
        "std": list(p.std),
        "steps": [_step(s) for s in p.steps],
        "tokens": {k: v.tolist() for k, v in sorted(tokens.items())},
    }
    return "sha256:" + hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()


def embedding_width(backend) -> int:
    """The width of the model's embeddings (one caption encoded): what a cached entry's arrays
    must have; 0 for a cross-encoder, which has none (its entries hold G of each pair)."""
    from training.evaluation import encode_texts

    if not backend.dual_encoder:
        return 0
    return int(encode_texts(backend.module, backend, PROBE_CAPTIONS[:1], 1).shape[1])
