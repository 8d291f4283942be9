"""`--aug-cfg KEY=VALUE ...`: the train augmentation's settings as open_clip's `AugmentationCfg`
reads them, checked when the configuration is (one line naming the item otherwise)."""

from __future__ import annotations

from typing import Any

from builders.engine.errors import UserFacingError

#: `--aug-cfg` keys: those open_clip's own train transform reads without timm
#: (`open_clip.transform.image_transform(is_train=True)`; `ratio` is ignored there, and timm's
#: random erasing runs after Normalize, which this trainer applies per batch).
AUG_CFG_KEYS = ("scale", "color_jitter", "color_jitter_prob", "gray_scale_prob")


def parse_aug_cfg(items: tuple[str, ...]) -> dict[str, Any]:
    """`--aug-cfg KEY=VALUE ...` as open_clip's `AugmentationCfg` fields (values read as Python
    literals, as open_clip_train's `ParseKwargs`), checked: one line naming the item otherwise."""
    import ast

    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or key not in AUG_CFG_KEYS:
            raise UserFacingError(
                f"--aug-cfg {item!r}: give KEY=VALUE with KEY one of "
                f"{', '.join(AUG_CFG_KEYS)} (open_clip's train transform)"
            )
        try:
            out[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[key] = text
    _check_aug_values(out)
    return out


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
