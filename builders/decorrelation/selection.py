"""Which classes to remove from an image: the selection rules of builders/decorrelation/METHOD.md §1 (paper §3.1, App. C).

Pure functions on boxes and class names; no pixels are read. For an image with boxes
O = {(b_i, c_i)} and at least `min_classes` distinct classes, every class c^r is tried in turn
(classes in sorted order, so the output does not depend on annotation order):

1. B^r = pixel mask of the union of the boxes of c^r; B^g likewise for every other class g.
2. Size rule: skip c^r (`region_too_large`) if area(B^r) / area(x) > alpha3.
3. overlap(g) = area(B^r ∩ B^g) / area(B^g).
4. Single-class removal if overlap(g) < alpha1 for every other g.
5. Else multi-class removal if overlap(g) > alpha2 for some g: remove c^r and every such g, and
   apply the size rule again to the union of their masks (the published pseudo-code only checks
   B^r; builders/decorrelation/METHOD.md §1 asks for both, and both report `region_too_large`).
6. Otherwise (some overlap in [alpha1, alpha2], none above alpha2) skip c^r (`partial_overlap`).

Choices where the paper is silent (also in the dataset card):

- Boxes are COCO (x, y, width, height) in pixels (possibly fractional), rasterised to every
  pixel they touch: pixel (row i, column j), the square [j, j+1) x [i, i+1), belongs to a box iff
  j < x + width and j + 1 > x (and likewise for rows), i.e. columns floor(x) .. ceil(x + width) - 1.
  A pixel-centre rule would leave a 1-pixel outline of the object along fractional edges
  (builders/decorrelation/METHOD.md §1). Parts outside the image are clipped. A box that covers no pixel (zero or negative size, fully
  outside the image, non-finite numbers) is dropped (`empty_box`) before the rules run, so its
  class neither counts towards the two classes nor is reported present.
- Crowd annotations (COCO `iscrowd=1`) are boxes of their class like any other.
- A removal that would leave no class in the image is skipped (`no_class_left`): its present
  set would be empty, so neither a prompt caption nor an ODmAP query could be made from it.
- As in the published pseudo-code, two anchors may produce the same removed set (A inside B and
  B inside A); each is a separate candidate.

Example:
    >>> boxes = [SourceObject("dog", (0, 0, 4, 4)), SourceObject("cat", (6, 6, 4, 4))]
    >>> sel = select_removals(boxes, 10, 10)
    >>> [(r.anchor, r.kind, r.removed, r.present) for r in sel.removals]
    [('cat', 'single', ('cat',), ('dog',)), ('dog', 'single', ('dog',), ('cat',))]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from builders.decorrelation.config import SelectionConfig
from loading_scripts.records import SourceObject

REASON_EMPTY_BOX = "empty_box"
REASON_FEW_CLASSES = "fewer_than_two_classes"
REASON_TOO_LARGE = "region_too_large"
REASON_PARTIAL = "partial_overlap"
REASON_NO_CLASS_LEFT = "no_class_left"
#: Every reason a candidate (or a whole image) can be rejected for, in rule order.
REASONS = (REASON_EMPTY_BOX, REASON_FEW_CLASSES, REASON_TOO_LARGE, REASON_PARTIAL, REASON_NO_CLASS_LEFT)
SINGLE, MULTI = "single", "multi"


@dataclass(frozen=True, eq=False)
class Removal:
    """A chosen removal: anchor class c^r, everything removed with it, and what stays."""

    anchor: str
    kind: str
    #: Removed classes, sorted (c^r plus, for `multi`, the classes above alpha2).
    removed: tuple[str, ...]
    #: Classes left in the image, sorted.
    present: tuple[str, ...]
    #: Bool [height x width]: union of the boxes of every removed class.
    mask: np.ndarray = field(repr=False)
    #: area(B') / area(x).
    region_fraction: float
    #: overlap(g) for every other class g (before removal).
    overlaps: dict[str, float]
    #: Indices (into the input boxes) of the removed classes' boxes.
    box_indices: tuple[int, ...]


@dataclass(frozen=True)
class Rejection:
    """A candidate that was not removed (anchor None: the whole image was rejected)."""

    reason: str
    anchor: str | None = None
    detail: str = ""


@dataclass
class Selection:
    removals: list[Removal]
    rejections: list[Rejection]


def box_mask(bbox: Sequence[float], width: int, height: int) -> np.ndarray:
    """Bool [height x width] mask of every pixel one box touches (empty if degenerate)."""
    mask = np.zeros((height, width), dtype=bool)
    rows, cols = _pixel_range(bbox[1], bbox[3], height), _pixel_range(bbox[0], bbox[2], width)
    if rows and cols:
        mask[rows[0] : rows[1], cols[0] : cols[1]] = True
    return mask


def _pixel_range(start: float, size: float, limit: int) -> tuple[int, int] | None:
    """Pixels p whose span [p, p + 1) meets [start, start + size) in more than a point, clipped
    to [0, limit)."""
    end = start + size
    if not (math.isfinite(start) and math.isfinite(end)) or size <= 0:
        return None
    first = max(0, math.floor(start))
    stop = min(limit, math.ceil(end))
    return (first, stop) if stop > first else None


def class_masks(
    boxes: Sequence[SourceObject], width: int, height: int
) -> tuple[dict[str, np.ndarray], dict[str, list[int]], list[int]]:
    """Per-class union masks, the box indices behind each, and the indices of empty boxes."""
    masks: dict[str, np.ndarray] = {}
    members: dict[str, list[int]] = {}
    empty: list[int] = []
    for i, box in enumerate(boxes):
        m = box_mask(box.bbox, width, height)
        if not m.any():
            empty.append(i)
            continue
        if box.category in masks:
            masks[box.category] |= m
        else:
            masks[box.category] = m
        members.setdefault(box.category, []).append(i)
    return masks, members, empty


def select_removals(
    boxes: Sequence[SourceObject], width: int, height: int, config: SelectionConfig = SelectionConfig()
) -> Selection:
    """Apply the builders/decorrelation/METHOD.md §1 rules to one image; see the module docstring."""
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    masks, members, empty = class_masks(boxes, width, height)
    rejections = [
        Rejection(
            REASON_EMPTY_BOX,
            boxes[i].category,
            f"box #{i} {tuple(boxes[i].bbox)} covers no pixel of the {width}x{height} image",
        )
        for i in empty
    ]
    classes = sorted(masks)
    if len(classes) < config.min_classes:
        rejections.append(Rejection(REASON_FEW_CLASSES, None, f"classes with pixels: {classes}"))
        return Selection([], rejections)
    image_area = width * height
    areas = {c: int(np.count_nonzero(masks[c])) for c in classes}
    removals: list[Removal] = []
    for anchor in classes:
        outcome = _try_anchor(anchor, classes, masks, members, areas, image_area, config)
        (removals if isinstance(outcome, Removal) else rejections).append(outcome)
    return Selection(removals, rejections)


def _try_anchor(
    anchor: str,
    classes: list[str],
    masks: dict[str, np.ndarray],
    members: dict[str, list[int]],
    areas: dict[str, int],
    image_area: int,
    config: SelectionConfig,
) -> Removal | Rejection:
    """Rules 2-6 (module docstring) for one anchor class c^r: the removal it makes, or the rejection
    naming the rule that stops it. Anchors do not affect each other: each sees the image's masks."""
    fraction = areas[anchor] / image_area
    if fraction > config.alpha3:
        return Rejection(REASON_TOO_LARGE, anchor, f"{anchor} covers {fraction:.3f} > {config.alpha3}")
    others = [g for g in classes if g != anchor]
    overlaps = {g: int(np.count_nonzero(masks[anchor] & masks[g])) / areas[g] for g in others}
    if all(v < config.alpha1 for v in overlaps.values()):
        kind, removed, region = SINGLE, [anchor], masks[anchor]
    elif any(v > config.alpha2 for v in overlaps.values()):
        kind = MULTI
        removed = sorted([anchor] + [g for g in others if overlaps[g] > config.alpha2])
        region = np.logical_or.reduce([masks[c] for c in removed])
        fraction = int(np.count_nonzero(region)) / image_area
        if fraction > config.alpha3:
            return Rejection(REASON_TOO_LARGE, anchor, f"{removed} cover {fraction:.3f} > {config.alpha3}")
    else:
        mid = {g: round(v, 3) for g, v in overlaps.items() if v >= config.alpha1}
        return Rejection(REASON_PARTIAL, anchor, f"overlaps in [alpha1, alpha2]: {mid}")
    present = tuple(c for c in classes if c not in removed)
    if not present:
        return Rejection(REASON_NO_CLASS_LEFT, anchor, f"removing {removed} empties the image")
    return Removal(
        anchor=anchor,
        kind=kind,
        removed=tuple(removed),
        present=present,
        mask=region,
        region_fraction=fraction,
        overlaps=overlaps,
        box_indices=tuple(sorted(i for c in removed for i in members[c])),
    )
