"""builders/decorrelation/METHOD.md §1 selection rules: `builders.decorrelation.selection` against an independent brute force.

The reference (`helpers/selection_reference.py`) rasterises boxes pixel by pixel into Python sets (a pixel is the unit square
[j, j+1) x [i, i+1); it belongs to a box when the two overlap with positive area) and applies the
rules as the paper's pseudo-code (Appendix C) states them, so it shares no code with the
implementation.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest

from builders.decorrelation.config import SelectionConfig
from builders.decorrelation.selection import REASONS, box_mask, select_removals
from loading_scripts.coco import CocoSourceConfig, read_coco
from loading_scripts.records import SourceObject

from helpers.selection_reference import brute_force


def ours(boxes, width, height, **alphas):
    sel = select_removals([SourceObject(c, b) for c, b in boxes], width, height, SelectionConfig(**alphas))
    got = set()
    for r in sel.removals:
        region = frozenset(map(tuple, np.argwhere(r.mask).tolist()))
        got.add((r.anchor, r.kind, frozenset(r.removed), frozenset(r.present), region))
        assert list(r.removed) == sorted(r.removed) and list(r.present) == sorted(r.present)
        assert r.region_fraction == pytest.approx(len(region) / (width * height))
        assert {boxes[i][0] for i in r.box_indices} == set(r.removed)
    return got, Counter(x.reason for x in sel.rejections), sel


def test_fixture_matches_brute_force_and_every_outcome_occurs(coco_fixture_dir):
    records = read_coco(CocoSourceConfig(coco_fixture_dir))
    outcomes = Counter()
    by_scene_anchor = {}
    for rec in records:
        boxes = [(o.category, o.bbox) for o in rec.objects]
        want, want_reasons = brute_force(boxes, rec.width, rec.height)
        got, got_reasons, sel = ours(boxes, rec.width, rec.height)
        assert got == want, rec.image_id
        assert got_reasons == want_reasons, rec.image_id
        outcomes.update(kind for _, kind, *_ in got)
        outcomes.update(got_reasons)
        for r in sel.removals:
            by_scene_anchor[(frozenset(c for c, _ in boxes), r.anchor)] = (r.kind, r.removed)
    # Every rule outcome occurs in the fixture, except empty boxes (the fixture has none).
    for outcome in ("single", "multi", *REASONS[1:]):
        assert outcomes[outcome] > 0, f"{outcome} never occurs: {outcomes}"
    # The scenes' intent (builders/fixtures/scenes.py), spot-checked.
    kitchen = frozenset({"refrigerator", "oven", "bottle", "bowl"})
    assert by_scene_anchor[(kitchen, "refrigerator")] == ("multi", ("bottle", "refrigerator"))
    assert by_scene_anchor[(frozenset({"horse", "person"}), "person")] == ("single", ("person",))
    assert (frozenset({"horse", "person"}), "horse") not in by_scene_anchor  # nothing would be left


@pytest.mark.parametrize("seed", range(6))
def test_random_boxes_match_brute_force(seed):
    rng = random.Random(seed)
    classes = ["a", "b", "c", "d"]
    outcomes = Counter()
    for _ in range(60):
        width, height = rng.randint(4, 14), rng.randint(4, 14)
        boxes = []
        for _ in range(rng.randint(1, 6)):
            x, y = rng.uniform(-3, width), rng.uniform(-3, height)
            w, h = rng.choice([rng.uniform(0, width), rng.uniform(0, 3), 0.0, -1.0]), rng.uniform(0, height)
            if rng.random() < 0.15:  # nested box: drives the multi-class rule
                px, py, pw, ph = boxes[-1][1] if boxes else (x, y, w, h)
                x, y, w, h = px + 0.5, py + 0.5, max(pw - 1, 0.5), max(ph - 1, 0.5)
            if rng.random() < 0.05:
                x = math.nan
            boxes.append((rng.choice(classes), (x, y, w, h)))
        alphas = {
            "alpha1": rng.choice([0.4, 0.2]),
            "alpha2": rng.choice([0.8, 0.6]),
            "alpha3": rng.choice([0.7, 0.95]),
        }
        want, want_reasons = brute_force(boxes, width, height, **alphas)
        got, got_reasons, _ = ours(boxes, width, height, **alphas)
        assert got == want, (width, height, boxes, alphas)
        assert got_reasons == want_reasons, (width, height, boxes, alphas)
        outcomes.update(k for _, k, *_ in got)
        outcomes.update(got_reasons)
    assert outcomes["single"] and outcomes["empty_box"] and outcomes["fewer_than_two_classes"]


def test_box_mask_covers_every_touched_pixel_and_clips():
    m = box_mask((3.2, 1.0, 2.0, 1.6), 8, 4)  # x in [3.2, 5.2): columns 3, 4, 5; y in [1, 2.6): rows 1, 2
    assert np.argwhere(m).tolist() == [[1, 3], [1, 4], [1, 5], [2, 3], [2, 4], [2, 5]]
    assert np.argwhere(box_mask((2.0, 1.0, 2.0, 1.0), 8, 4)).tolist() == [[1, 2], [1, 3]]  # edges on pixel borders
    assert np.argwhere(box_mask((2.9, 0.5, 0.05, 0.01), 8, 4)).tolist() == [[0, 2]]  # a sliver touches one pixel
    assert box_mask((-5, -5, 6, 6), 4, 4).sum() == 1  # only pixel (0, 0) is inside the image
    for bad in [
        (1, 1, 0, 3),
        (9, 9, 2, 2),
        (1, 1, -2, 3),
        (math.nan, 0, 2, 2),
        (0, 0, math.inf, 2),
        (8, 0, 2, 2),
        (-2, 0, 2, 2),
    ]:  # zero-area, outside, non-finite, touching only an edge
        assert not box_mask(bad, 8, 8).any(), bad


def test_thresholds_are_configurable_and_validated():
    boxes = [("a", (0, 0, 10, 10)), ("b", (5, 0, 10, 10))]  # each overlaps the other by 0.5
    assert ours(boxes, 20, 20)[1] == Counter({"partial_overlap": 2})
    assert {k for _, k, *_ in ours(boxes, 20, 20, alpha1=0.6)[0]} == {"single"}
    assert {k for _, k, *_ in ours(boxes, 20, 20, alpha2=0.45)[0]} == set()  # both removed: nothing left
    assert ours(boxes, 20, 20, alpha2=0.45)[1] == Counter({"no_class_left": 2})
    for bad in ({"alpha1": 0.9}, {"alpha3": 1.5}, {"min_classes": 1}):
        with pytest.raises(ValueError):
            SelectionConfig(**bad)
