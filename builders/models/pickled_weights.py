"""Pickled model weights (`.bin`, `.pt`, `.pth`, `.ckpt`): refused unless the run trusts them.

Unpickling can run code. transformers, diffusers, open_clip and sentence-transformers read a
pickled weight file with `torch.load(weights_only=True)`, a restricted unpickler that refuses the
globals a payload needs; but it is still an unpickler over bytes from elsewhere (torch before 2.6
could be made to run code through it, CVE-2025-32434), while safetensors is a JSON header and raw
tensor bytes. So the loaders (`builders.models.loaders`) read safetensors weights only:

- a local folder (or file) whose weights exist only as a pickle is one line naming the file and
  `--trust-pickled-weights`, before any library opens it;
- a Hub id is loaded with the libraries' safetensors-only switches (`use_safetensors=True`), and
  an open_clip checkpoint is resolved (downloaded, not loaded) and checked by its file name first.

`--trust-pickled-weights` (every build, `train`, `benchmark`, `eccv candidates`, `eccv
model-bias`) lifts the refusal for one run; the libraries then still unpickle with
`weights_only=True` (no call of ours turns it off), so a payload is refused by torch (one line as
well) and never runs.

Trust is a property of the run, not of a model role, and the loaders are called from every
builder's stages: it is set once per run with `trusting_pickled_weights` (restored afterwards,
so one in-process run cannot leak it into the next) instead of being threaded through each
builder's config. `accelerate launch` starts every process with the same flags, so each sets it.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Iterator

from builders.engine.errors import UserFacingError

FLAG = "--trust-pickled-weights"
FLAG_HELP = (
    "load model weights stored as pickles (.bin/.pt/.pth/.ckpt) when no safetensors "
    "exist; unpickling can run code, so only for models whose source you trust (they "
    "are still loaded with torch's weights_only=True)"
)
#: Suffixes of files that torch.load / pickle would unpickle.
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle"})
#: Weight formats read without unpickling (open_clip reads big_vision `.npz` with np.load,
#: whose allow_pickle is off).
SAFE_SUFFIXES = frozenset({".safetensors", ".npz", ".npy"})

_trusted = False


class PickledWeightsError(UserFacingError):
    """Pickled weights refused: untrusted, or holding what torch's weights_only loading refuses.
    Its own class so that callers which reword loader errors pass it on as it is."""


@contextlib.contextmanager
def trusting_pickled_weights(trusted: bool) -> Iterator[None]:
    """Within the block the loaders accept pickled weights iff `trusted`."""
    global _trusted
    saved, _trusted = _trusted, bool(trusted)
    try:
        yield
    finally:
        _trusted = saved


def pickled_weights_trusted() -> bool:
    return _trusted


def use_safetensors() -> bool | None:
    """The `use_safetensors` of transformers / diffusers `from_pretrained`: True (safetensors or
    an error) unless trusted; None lets them fall back to a pickle (loaded weights_only)."""
    return None if _trusted else True


def refused_global(err: Exception) -> str:
    """What torch's weights_only loading refused, from its error (not its advice to allow-list
    the object or to retry with weights_only=False)."""
    found = re.search(r"GLOBAL ([\w.]+)", str(err))
    return f"a call of {found.group(1)}" if found else (" ".join(str(err).split())[:200] or type(err).__name__)


def refusal(role: str, model_id: str, file: str | Path) -> PickledWeightsError:
    return PickledWeightsError(
        f"{file}: the {role} model {model_id} has its weights only as a pickle, which can run "
        "code when loaded; counterfactory loads safetensors weights only (save the model with "
        f"save_pretrained / safetensors, or pass {FLAG} if you trust its source)"
    )


def pickled_only(folder: Path) -> list[Path]:
    """The pickle files of `folder` and its sub-folders (a diffusers pipeline's unet/, vae/, ...)
    that hold a folder's only weights: a pickle beside a `.safetensors` file is never read,
    since the loaders ask for safetensors."""
    found = []
    for root, dirs, files in os.walk(folder):  # not into symlinked folders
        dirs.sort()
        if any(Path(f).suffix in SAFE_SUFFIXES for f in files):
            continue
        found += [Path(root) / f for f in sorted(files) if Path(f).suffix in PICKLE_SUFFIXES]
    return found


def check_local(role: str, model_id: str, path: str | Path) -> None:
    """Refuse (unless trusted) a local model folder or weight file that only pickles hold.
    A path that does not exist is left to the loader (a Hub id, or its own error)."""
    if _trusted:
        return
    path = Path(path)
    if path.is_dir():
        pickled = pickled_only(path)
        if pickled:
            raise refusal(role, model_id, pickled[0])
    elif path.is_file() and path.suffix not in SAFE_SUFFIXES:
        raise refusal(role, model_id, path)


def check_open_clip(model_id: str, name: str, pretrained: str | None) -> None:
    """The checkpoint open_clip's `create_model` would load for (name, pretrained), refused
    (unless trusted) when it is not safetensors: a `local-dir:` folder, a file given as the tag,
    or the file an `hf-hub:` id or a pretrained tag resolves to (open_clip's own download, which
    prefers safetensors; downloading reads nothing)."""
    if _trusted:
        return
    import open_clip
    from open_clip.pretrained import download_pretrained, download_pretrained_from_hf

    if name.startswith("local-dir:"):
        check_local("open_clip", model_id, name[len("local-dir:") :])
        return
    if name.startswith("hf-hub:"):
        resolved = download_pretrained_from_hf(name[len("hf-hub:") :])
    elif pretrained and Path(pretrained).exists():
        check_local("open_clip", model_id, pretrained)
        return
    elif pretrained:
        cfg = open_clip.get_pretrained_cfg(name.replace("/", "-"), pretrained)
        resolved = download_pretrained(cfg) if cfg else None
    else:
        return  # random init, nothing loaded
    if resolved and Path(resolved).suffix not in SAFE_SUFFIXES:
        raise refusal("open_clip", model_id, Path(resolved).name)
