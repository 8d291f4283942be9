"""`--aug-cfg KEY=VALUE ...`: the train augmentation's settings as open_clip's `AugmentationCfg`
reads them, checked when the configuration is (one line naming the item otherwise)."""

from __future__ import annotations

import math
import re
from typing import Any

from builders.engine.errors import UserFacingError

#: `--aug-cfg` keys: those open_clip's own train transform reads without timm
#: (`open_clip.transform.image_transform(is_train=True)`; `ratio` is ignored there, and timm's
#: random erasing runs after Normalize, which this trainer applies per batch).
AUG_CFG_KEYS = ("scale", "color_jitter", "color_jitter_prob", "gray_scale_prob")


def parse_aug_cfg(items: tuple[str, ...]) -> dict[str, Any]:
    """`--aug-cfg KEY=VALUE ...` as open_clip's `AugmentationCfg` fields (values written as
    open_clip_train's `ParseKwargs` reads them: a number, a name, or a tuple of those), checked
    against the ranges open_clip's transform and torchvision give them: one line naming the item
    otherwise, before the run writes anything."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or key not in AUG_CFG_KEYS:
            raise UserFacingError(
                f"--aug-cfg {_shown(item)}: give KEY=VALUE with KEY one of "
                f"{', '.join(AUG_CFG_KEYS)} (open_clip's train transform)"
            )
        out[key] = _value(item, text)
    _check_aug_values(out)
    return out


#: The longest value read: the settings are a few numbers (the grammar bounds the work too).
_MAX_VALUE = 200
_NUMBER = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_ATOM = rf"(?:{_NUMBER}|[A-Za-z_]\w*)"
#: A number, a name, or a flat tuple / list of them: all open_clip's AugmentationCfg takes.
_GRAMMAR = re.compile(rf"\s*(?:{_ATOM}|[(\[]\s*(?:{_ATOM}\s*(?:,\s*{_ATOM}\s*)*,?\s*)?[)\]])\s*")
_NAMES = {"None": None, "True": True, "False": False}


def _value(item: str, text: str) -> Any:
    """A number, None/True/False, another name as its text, or a tuple of those."""
    if len(text) > _MAX_VALUE or not _GRAMMAR.fullmatch(text):
        raise UserFacingError(
            f"--aug-cfg {_shown(item)}: give a number or a tuple of numbers "
            f"(at most {_MAX_VALUE} characters), e.g. scale='(0.9, 1.0)'"
        )
    atoms = [_atom(a.strip()) for a in text.strip().strip("()[]").split(",") if a.strip()]
    return tuple(atoms) if text.strip()[0] in "([" else atoms[0]


def _atom(text: str) -> Any:
    if text in _NAMES:
        return _NAMES[text]
    if not re.fullmatch(_NUMBER, text):
        return text
    number = float(text)
    return int(text) if re.fullmatch(r"[+-]?\d+", text) else number


def _shown(item: str) -> str:
    """`item` for an error line: a long one cut short."""
    return repr(item if len(item) <= 80 else item[:60] + "...")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_aug_values(cfg: dict[str, Any]) -> None:
    scale = cfg.get("scale", (0.9, 1.0))
    if not (
        isinstance(scale, (tuple, list))
        and len(scale) == 2
        and all(map(_is_number, scale))
        and 0 < scale[0] <= scale[1] <= 1
    ):
        raise UserFacingError(
            f"--aug-cfg scale={scale!r}: give the crop's area range as "
            "'(LOW, HIGH)' with 0 < LOW <= HIGH <= 1, e.g. scale='(0.9, 1.0)'"
        )
    for key in ("color_jitter_prob", "gray_scale_prob"):
        if key in cfg and not (_is_number(cfg[key]) and 0 <= cfg[key] <= 1):
            raise UserFacingError(f"--aug-cfg {key}={cfg[key]!r}: give a probability in [0, 1]")
    jitter = cfg.get("color_jitter")
    if (
        ("color_jitter" in cfg) != ("color_jitter_prob" in cfg)
        or jitter is not None
        and not (isinstance(jitter, (tuple, list)) and len(jitter) == 4 and all(map(_is_number, jitter)))
    ):
        raise UserFacingError(
            "--aug-cfg color_jitter and color_jitter_prob go together: "
            "color_jitter='(BRIGHTNESS, CONTRAST, SATURATION, HUE)' "
            "color_jitter_prob=P, as open_clip's train transform reads them"
        )
    if jitter is not None:
        _check_jitter_ranges(tuple(jitter))


def _check_jitter_ranges(jitter: tuple) -> None:
    """torchvision's ColorJitter ranges of single numbers (`_check_input`): brightness, contrast
    and saturation a finite factor >= 0, hue in [0, 0.5]; refused here, before the run writes
    anything, rather than by torchvision when the transform is built."""
    *factors, hue = jitter
    if not (all(math.isfinite(f) and f >= 0 for f in factors) and 0 <= hue <= 0.5):
        raise UserFacingError(
            f"--aug-cfg color_jitter={jitter!r}: brightness, contrast and saturation must be "
            "finite and >= 0, and hue in [0, 0.5] (torchvision's ColorJitter), e.g. "
            "color_jitter='(0.4, 0.4, 0.4, 0.1)'"
        )
