"""argparse `type=` functions that check an option's range at parse time.

A bad value fails before any work starts, with argparse's one-line usage error naming the option
(`--max-images: must be at least 1 (got 0)`), instead of a build that runs and fails later. Every
number is finite: `float()` reads `nan` and `inf`, which would otherwise pass every range check
(a comparison with NaN is false) and draw black images or train on NaN (#49). `check_image_side`
checks an image side against the generator another option names, when the config is made.
"""

from __future__ import annotations

import argparse
import math

from builders.engine.errors import UserFacingError

#: `--steps`' bound: the schedulers' training timesteps (`num_train_timesteps`, 1,000 for every
#: generator's scheduler), more inference steps than a scheduler has timesteps cannot be drawn.
MAX_STEPS = 1000
#: Seeds are 32-bit: numpy's legacy `RandomState` (and so `accelerate.utils.set_seed`) takes no
#: more, and `torch.Generator.manual_seed` takes them all.
SEED_LIMIT = 2**32


def _number(kind: type, text: str) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def between(minimum: int, maximum: int | None = None, why: str = ""):
    """An integer option in [`minimum`, `maximum`] (None: no upper bound); `why` says where the
    upper bound comes from (`must be at most 1000, the schedulers' ...`)."""

    def parse(text: str) -> int:
        value = _number(int, text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum} (got {value})")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}{why} (got {value})")
        return value

    # argparse names the type in some messages
    parse.__name__ = f"integer >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
    return parse


def at_least(minimum: int):
    """An integer option that must be >= `minimum`."""
    return between(minimum)


positive_int = at_least(1)
non_negative_int = at_least(0)
#: Denoising steps: 1 to `MAX_STEPS`.
steps_int = between(1, MAX_STEPS, ", the schedulers' training timesteps")
#: A random seed: 0 to `SEED_LIMIT` - 1.
seed_int = between(0, SEED_LIMIT - 1, ", the largest 32-bit seed")


def number(text: str) -> float:
    """A finite number: the type of every float option (`builders.engine.options`)."""
    return float(_number(float, text))


def number_at_least(minimum: float, strictly: bool = False):
    """A finite number >= `minimum` (> with `strictly`)."""

    def parse(text: str) -> float:
        value = number(text)
        if value < minimum or (strictly and value == minimum):
            raise argparse.ArgumentTypeError(f"must be {'above' if strictly else 'at least'} {minimum:g} (got {text})")
        return value

    parse.__name__ = f"number {'>' if strictly else '>='} {minimum:g}"
    return parse


non_negative_number = number_at_least(0.0)
positive_number = number_at_least(0.0, strictly=True)


def fraction(text: str) -> float:
    """A number in [0, 1]."""
    value = number(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (got {text})")
    return value


def check_image_side(size: int, multiple: int, flag: str, who: str) -> None:
    """Refuse an image side `who` cannot draw: its VAE decodes `size // scale factor` latents, so
    any other side gives smaller images than the rows say (`--image-size 7` stored 6 x 6 images,
    #49). The message names the nearest sides it can draw."""
    if size >= multiple and size % multiple == 0:
        return
    low = size - size % multiple
    nearest = " or ".join(str(side) for side in (low, low + multiple) if side >= multiple)
    raise UserFacingError(
        f"{flag} {size}: {who} draws images whose side is a multiple of {multiple} pixels; give {nearest}"
    )
