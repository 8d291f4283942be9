"""argparse `type=` functions that check an option's range at parse time.

A bad value fails before any work starts, with argparse's one-line usage error naming the option
(`--max-images: must be at least 1 (got 0)`), instead of a build that runs and fails later.
"""

from __future__ import annotations

import argparse


def _number(kind: type, text: str) -> int | float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None


def at_least(minimum: int):
    """An integer option that must be >= `minimum`."""

    def parse(text: str) -> int:
        value = _number(int, text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum} (got {value})")
        return value

    parse.__name__ = f"integer >= {minimum}"  # argparse names the type in some messages
    return parse


positive_int = at_least(1)
non_negative_int = at_least(0)


def fraction(text: str) -> float:
    """A number in [0, 1]."""
    value = float(_number(float, text))
    if not 0.0 <= value <= 1.0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (got {text})")
    return value
