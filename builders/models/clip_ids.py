"""Which CLIP implementation a model id names, and what its loader is given.

Two spellings meet here. The MITL annotators' `--model` names the implementation by the id:
`open_clip:ARCH[:TAG]`, `hf-hub:ORG/REPO` and `local-dir:PATH` are open_clip, anything else is
a transformers Hub id or `save_pretrained` folder. The trainer names it with `--backend`, and its
open_clip `--model` is `hf-hub:...`, `local-dir:PATH`, an existing folder (read as `local-dir:`)
or `ARCH[:TAG]`. Imports nothing heavy: the loaders and `--help` paths read it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from builders.engine.provenance import hub_snapshot

TRANSFORMERS, OPEN_CLIP = "transformers", "open_clip"
#: Ids with one of these prefixes name an open_clip model when the backend is not given.
OPEN_CLIP_PREFIXES = ("open_clip:", "hf-hub:", "local-dir:")


#: The spellings a CLIP model id may take, for the one line that refuses another.
EXPECTED = (
    "a Hugging Face CLIP id or save_pretrained folder, or open_clip's ARCH[:TAG], "
    "hf-hub:ORG/REPO or local-dir:PATH (open_clip:... where the backend is not given)"
)


class ClipIdError(ValueError):
    """A model id that names no model (an empty architecture, repo or folder). Its message is the
    problem and the fix, read after the id: the caller turns it into one line naming its flag,
    `--model 'hf-hub:' names no model; give ...`."""


@dataclass(frozen=True)
class ClipId:
    """A CLIP model id resolved to its implementation: parsed once where the id comes in (a
    flag, a config field), and passed as it is to every layer below, which reads its fields and
    never the id's text again."""

    backend: str
    #: The id as given (`open_clip:` dropped): what messages name.
    model_id: str
    #: transformers: `model_id`; open_clip: what `create_model_and_transforms` is given
    #: (`hf-hub:ORG/REPO`, `local-dir:PATH` or an architecture name).
    name: str
    #: open_clip's pretrained tag (or checkpoint file) of an architecture name.
    pretrained: str | None = None

    @property
    def label(self) -> str:
        """The model in messages and logs: an architecture with its weights tag (`ViT-B-32:openai`,
        also when the tag came from `--pretrained`), else the id."""
        return f"{self.name}:{self.pretrained}" if self.pretrained else self.model_id

    @property
    def names_weights(self) -> bool:
        """Whether the id itself says which weights to load (a `--pretrained` tag cannot apply)."""
        return (
            self.backend == TRANSFORMERS
            or self.pretrained is not None
            or self.name.startswith(("hf-hub:", "local-dir:"))
        )


def parse_clip_id(model_id: str, backend: str | None = None, pretrained: str | None = None) -> ClipId:
    """`backend` None infers it from the spelling (the annotators' ids); `transformers` or
    `open_clip` is the trainer's `--backend`, whose `--pretrained` tag of an architecture name is
    `pretrained` (refused beside an id that names its weights). An id naming nothing raises
    `ClipIdError`."""
    if backend is None:
        if not model_id.startswith(OPEN_CLIP_PREFIXES):
            return _checked(ClipId(TRANSFORMERS, model_id, model_id))
        backend, model_id = OPEN_CLIP, model_id.removeprefix("open_clip:")
    if backend == TRANSFORMERS:
        return _checked(ClipId(TRANSFORMERS, model_id, model_id))
    if backend != OPEN_CLIP:
        raise ValueError(f"unknown CLIP backend {backend!r} (expected {TRANSFORMERS} or {OPEN_CLIP})")
    if model_id.startswith(("hf-hub:", "local-dir:")):
        clip = ClipId(OPEN_CLIP, model_id, model_id)
    elif model_id and Path(model_id).is_dir():
        clip = ClipId(OPEN_CLIP, model_id, f"local-dir:{model_id}")
    else:
        arch, _, tag = model_id.partition(":")
        clip = ClipId(OPEN_CLIP, model_id, arch, tag or None)
    if pretrained is None:
        return _checked(clip)
    if clip.names_weights:
        raise ClipIdError(
            f"already says which weights to load, so --pretrained {pretrained} cannot "
            "apply; give an architecture name (ViT-B-32) or drop --pretrained"
        )
    return _checked(ClipId(OPEN_CLIP, model_id, clip.name, pretrained))


def _checked(clip: ClipId) -> ClipId:
    """`clip`, unless it names nothing: an empty id, architecture, `hf-hub:` repo or `local-dir:`
    folder."""
    prefixed = clip.backend == OPEN_CLIP and clip.name.startswith(("hf-hub:", "local-dir:"))
    if (clip.name.partition(":")[2] if prefixed else clip.name).strip():
        return clip
    raise ClipIdError(f"names no model; give {EXPECTED}")


def open_clip_model_config(clip: ClipId) -> dict:
    """open_clip's `model_cfg` of the model `clip` names (saved beside retrained weights)."""
    import open_clip

    if clip.name.startswith("local-dir:"):
        folder = Path(clip.name[len("local-dir:") :])
        return json.loads((folder / "open_clip_config.json").read_text())["model_cfg"]
    if clip.name.startswith("hf-hub:"):
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(clip.name[len("hf-hub:") :], "open_clip_config.json")
        return json.loads(Path(path).read_text())["model_cfg"]
    return open_clip.get_model_config(clip.name)


def weights_fingerprint(model_id: str) -> str:
    """Size and mtime of the weight files of an annotator id: a local folder or file, or the Hub
    snapshot cached for a Hub id; retraining into the same path changes it.

    A Hub id not yet downloaded (and an open_clip pretrained tag, which names a fixed release)
    has no files to stat: the id alone identifies it ("unresolved")."""
    name = model_id.removeprefix("local-dir:").removeprefix("open_clip:")
    if model_id.startswith("open_clip:"):
        name = name.partition(":")[2]  # ARCH:TAG, where TAG may be a checkpoint file
    path = Path(name) if name and Path(name).exists() else _hub_snapshot(model_id)
    if path is None:
        return "unresolved"
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    stats = [(p.relative_to(path).as_posix(), st.st_size, st.st_mtime_ns) for p, st in ((p, p.stat()) for p in files)]
    return hashlib.sha256(json.dumps([str(path.resolve()), stats]).encode()).hexdigest()[:16]


def _hub_snapshot(model_id: str) -> Path | None:
    """The locally cached snapshot folder of a Hub model (its name is the commit), if any."""
    if model_id.startswith(("open_clip:", "local-dir:")):
        return None
    return hub_snapshot(model_id.removeprefix("hf-hub:"))
