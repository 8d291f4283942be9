"""Per-item seeds derived from stable ids, never from batch position or process rank.

This is what makes a build's output independent of the process count and batch size: the
randomness an item sees depends only on the run seed and the item's own id.
"""

from __future__ import annotations

import hashlib


def derive_seed(base_seed: int, *keys: object) -> int:
    """A 63-bit seed from the run seed and an item's identifying keys (stable across runs)."""
    text = "\x1f".join([str(base_seed), *map(str, keys)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1
