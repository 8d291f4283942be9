"""A brute-force reading of the decorrelation selection rules (every pixel, every box), to check
`builders.decorrelation.selection` against."""

from __future__ import annotations

import math
from collections import Counter


def touched_pixels(box, width, height, grow=0.0):
    """(row, column) of every pixel square the box (x, y, w, h), grown by `grow` on each side,
    overlaps with positive area; a box with a non-finite number or no area touches nothing."""
    x, y, w, h = box
    if not all(map(math.isfinite, (x, y, x + w, y + h))) or w <= 0 or h <= 0:
        return set()
    x0, y0, x1, y1 = x - grow, y - grow, x + w + grow, y + h + grow
    return {
        (i, j)
        for i in range(height)
        for j in range(width)
        if min(j + 1, x1) - max(j, x0) > 0 and min(i + 1, y1) - max(i, y0) > 0
    }


def brute_force(boxes, width, height, alpha1=0.4, alpha2=0.8, alpha3=0.7):
    """-> (set of (anchor, kind, removed, present, pixels), Counter of reasons)."""
    reasons = Counter()
    pixels = {}
    for category, box in boxes:
        inside = touched_pixels(box, width, height)
        if not inside:
            reasons["empty_box"] += 1
            continue
        pixels.setdefault(category, set()).update(inside)
    out = set()
    if len(pixels) < 2:
        reasons["fewer_than_two_classes"] += 1
        return out, reasons
    for anchor in pixels:
        if len(pixels[anchor]) / (width * height) > alpha3:
            reasons["region_too_large"] += 1
            continue
        overlaps = {g: len(pixels[anchor] & pixels[g]) / len(pixels[g]) for g in pixels if g != anchor}
        if all(v < alpha1 for v in overlaps.values()):
            kind, removed = "single", {anchor}
        elif any(v > alpha2 for v in overlaps.values()):
            kind, removed = "multi", {anchor} | {g for g, v in overlaps.items() if v > alpha2}
        else:
            reasons["partial_overlap"] += 1
            continue
        region = set().union(*(pixels[c] for c in removed))
        if len(region) / (width * height) > alpha3:
            reasons["region_too_large"] += 1
            continue
        present = set(pixels) - removed
        if not present:
            reasons["no_class_left"] += 1
            continue
        out.add((anchor, kind, frozenset(removed), frozenset(present), frozenset(region)))
    return out, reasons
