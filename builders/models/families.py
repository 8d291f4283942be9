"""Which image-text model family a transformers `--model` is, read from its `config.json`.

The two papers' models (Exposing and Mitigating Spurious Correlations: CLIP and BLIP;
COCO-Counterfactuals: BridgeTower, CLIP, ViLT and FLAVA) are told apart by `model_type` and
`architectures` alone, before any weight or dataset is read: a Hub id's `config.json` is read as
JSON from the cache (or the Hub), a `save_pretrained` folder's from the folder. Imports nothing
heavy: option parsing reads it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from builders.engine.errors import UserFacingError
from builders.models.clip_ids import OPEN_CLIP, ClipId, ClipIdError, parse_clip_id

log = logging.getLogger(__name__)

#: BLIP's COCO retrieval `k_test` (salesforce/BLIP configs/retrieval_coco.yaml): the default k a
#: cross-encoder re-ranks (`--rerank-k` of the benchmark, the trainer and the MITL annotators).
DEFAULT_K = 256


@dataclass(frozen=True)
class Family:
    """A model family counterfactory scores: its name in messages and records, the transformers
    class that holds the head its G is read from, and whether it is a dual encoder (separate
    image and text embeddings: retrieval by embedding) or a cross-encoder (a score per pair)."""

    name: str
    model_type: str
    #: architecture -> the transformers class loaded for it (the head scoring G).
    heads: tuple[str, ...]
    dual_encoder: bool


CLIP = Family("CLIP", "clip", ("CLIPModel",), True)
BLIP = Family("BLIP", "blip", ("BlipForImageTextRetrieval",), False)
BRIDGETOWER = Family(
    "BridgeTower", "bridgetower", ("BridgeTowerForImageAndTextRetrieval", "BridgeTowerForContrastiveLearning"), False
)
VILT = Family("ViLT", "vilt", ("ViltForImageAndTextRetrieval",), False)
FLAVA = Family("FLAVA", "flava", ("FlavaForPreTraining", "FlavaModel"), False)
FAMILIES = (CLIP, BLIP, BRIDGETOWER, VILT, FLAVA)

#: The families and architectures accepted, for the one line that refuses another model.
ACCEPTED = "; ".join(
    f"{f.name} ({f.model_type}{': ' + ', '.join(f.heads) if f.model_type != 'clip' else ''})" for f in FAMILIES
)


class FamilyError(ValueError):
    """A config.json of no accepted family (or no accepted head of one): its message names the
    type and architectures found and the families accepted, read after the id."""


@dataclass(frozen=True)
class ModelFamily:
    """A model's family and the architecture its config names (the class to load)."""

    family: Family
    architecture: str

    @property
    def dual_encoder(self) -> bool:
        return self.family.dual_encoder


def read_config(model_id: str) -> dict | None:
    """`config.json` of a save_pretrained folder or Hub id, as JSON (never a weight file); None
    when there is none to read (not a transformers folder, an id not cached and offline): the
    loader then reports the id as it does for any model it cannot load."""
    folder = Path(model_id)
    if folder.is_dir():
        path = folder / "config.json"
    else:
        try:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(model_id, "config.json"))
        except Exception:  # noqa: BLE001 - unreachable, gated, not a repo: the loader says which
            return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def model_family(model_id: str) -> ModelFamily:
    """The family of a transformers model id; CLIP when its config cannot be read (today's
    loader then names the id). A family's config that names no architecture (some Hub configs,
    written before transformers recorded one) gets the family's first head, its ITM head, as
    COCO-Counterfactuals' scoring script loads such a checkpoint, said in one logged line. A
    config of another type, or one naming none of its family's accepted heads, raises
    `FamilyError`."""
    config = read_config(model_id)
    if config is None:
        return ModelFamily(CLIP, "CLIPModel")
    model_type = str(config.get("model_type", ""))
    architectures = [str(a) for a in config.get("architectures") or []]
    family = next((f for f in FAMILIES if f.model_type == model_type), None)
    if family is CLIP:
        return ModelFamily(CLIP, "CLIPModel")
    if family is not None and not architectures:
        log.info("%s: config.json names no architecture; loaded as %s", model_id, family.heads[0])
        return ModelFamily(family, family.heads[0])
    head = next((a for a in architectures if family and a in family.heads), None)
    if family is None or head is None:
        found = f"model_type {model_type or 'missing'!r}"
        found += f" with architectures {', '.join(architectures)}" if architectures else " with no architectures"
        raise FamilyError(f"has {found}, not a model counterfactory scores; give a model of {ACCEPTED}")
    return ModelFamily(family, head)


def named_model(name: str, flag: str = "--model") -> tuple[ClipId, ModelFamily]:
    """`name`, given as `flag`, parsed before any data is read (the one parse of the benchmark,
    the trainer and the MITL annotators): its id and its family (an open_clip model is a CLIP).
    One naming nothing, or a model of no accepted family, is one line naming the flag."""
    # An open_clip folder has no prefix to tell it: its config file does.
    backend = OPEN_CLIP if (Path(name) / "open_clip_config.json").is_file() else None
    try:
        clip = parse_clip_id(name, backend)
        return clip, ModelFamily(CLIP, "open_clip") if clip.backend == OPEN_CLIP else model_family(name)
    except (ClipIdError, FamilyError) as err:
        raise UserFacingError(f"{flag} {name[:200]!r} {err}") from None
