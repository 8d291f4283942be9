"""Reader of the ECCV Caption / CxC / COCO positives shipped in eccv_caption, and PM positives."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from builders.engine.errors import InputFileError
from counterfactory_metrics.map_at_r.eccv_suite import EccvAnnotations
from loading_scripts.eccv import (
    coco_test_caption_ids,
    eccv_data_dir,
    pm_positives,
    pm_positives_from_instances,
    read_pm_positives,
    read_positive_files,
    read_positives,
)

PREFIX = {"eccv": "eccv", "cxc": "cxc", "coco": "original"}


def raw(source: str, direction: str) -> dict[int, list[int]]:
    name = {"i2t": "image_to_caption", "t2i": "caption_to_image"}[direction]
    data = json.loads((eccv_data_dir() / f"{PREFIX[source]}_{name}.json").read_text())
    return {int(k): [int(x) for x in v] for k, v in data.items()}


@pytest.mark.parametrize("source", ["eccv", "cxc", "coco"])
def test_read_positives_equals_the_shipped_json(source):
    positives = read_positives(source)
    for direction in ("i2t", "t2i"):
        expected = raw(source, direction)
        got = getattr(positives, direction)
        assert list(got) == list(expected)  # file order is kept (it orders the mean)
        assert all(got[k].dtype == np.int64 and got[k].tolist() == v for k, v in expected.items())


def test_known_sizes_of_the_shipped_annotations():
    eccv, coco = read_positives("eccv"), read_positives("coco")
    assert (len(eccv.i2t), len(eccv.t2i)) == (1261, 1332)  # paper: 1,261 images, 1,333 captions
    assert (len(coco.i2t), len(coco.t2i)) == (5000, 25000)
    assert len(read_positives("cxc").i2t) == 5000
    ids = coco_test_caption_ids()
    np.testing.assert_array_equal(ids, np.load(eccv_data_dir() / "coco_test_ids.npy"))
    assert sorted(ids.tolist()) == sorted(coco.t2i)


def test_coco_1k_folds_partition_the_test_split():
    ann = EccvAnnotations.load()
    folds = ann.coco_1k_folds()
    assert len(folds) == 5
    seen_images = set()
    for f, fold in enumerate(folds):
        assert list(fold["t2i"]) == ann.coco_test_ids[5000 * f : 5000 * (f + 1)].tolist()
        assert len(fold["i2t"]) == 1000
        # Each image's five captions are in its own fold.
        for image, captions in fold["i2t"].items():
            assert set(captions.tolist()) <= set(fold["t2i"])
        seen_images |= set(fold["i2t"])
    assert seen_images == set(ann.coco.i2t)


def write_pm_files(folder: Path, i2t: dict, t2i: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pm_image_to_caption.json").write_text(json.dumps({str(k): v for k, v in i2t.items()}))
    (folder / "pm_caption_to_image.json").write_text(json.dumps({str(k): v for k, v in t2i.items()}))


def test_pm_files_read(tmp_path):
    write_pm_files(tmp_path / "pm", {1: [10, 11]}, {10: [1], 11: [1, 2]})
    pm = read_pm_positives(tmp_path / "pm")
    assert pm.t2i[11].tolist() == [1, 2]
    assert {k: v.tolist() for k, v in pm.i2t.items()} == {1: [10, 11]}
    with pytest.raises(InputFileError, match="pm_image_to_caption.json: PM positives file is missing"):
        read_pm_positives(tmp_path)


@pytest.mark.parametrize(
    "content, problem",
    [
        ('{"1": [2, 3', "malformed JSON at line 1"),
        ("[1, 2]", "expected an object id -> \\[ids\\], got list"),
        ('{"1": ["x"]}', "entry '1' is not an id -> list of ids"),
    ],
)
def test_malformed_files_name_the_file(tmp_path, content, problem):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    (tmp_path / "ok.json").write_text("{}")
    with pytest.raises(InputFileError, match=f"bad.json: {problem}"):
        read_positive_files(bad, tmp_path / "ok.json")
    with pytest.raises(InputFileError, match="unknown annotation source"):
        read_positives("flickr")
    with pytest.raises(InputFileError, match="positives file is missing"):
        read_positives("eccv", data_dir=tmp_path)


# ----------------------------------------------------------------------------- plausible matches


def reference_pm(classes_by_image, image_to_captions, zeta, omit_own):
    """The PCME / ECCV Caption tooling's procedure, as a plain loop: 90-slot class codes of the
    images that have instances, pairwise Hamming distance <= zeta, sets of ids."""
    codes = {}
    for image, categories in classes_by_image.items():
        code = [0] * 90
        for c in categories:
            code[c - 1] = 1
        codes[image] = code
    i2t, t2i = {}, {}
    for a in codes:
        matches = {b for b in codes if sum(x != y for x, y in zip(codes[a], codes[b], strict=True)) <= zeta}
        if omit_own:
            matches.discard(a)
        for caption in image_to_captions[a]:
            t2i.setdefault(caption, set()).update(matches)
        for b in matches:
            i2t.setdefault(a, set()).update(image_to_captions[b])
    return i2t, t2i


@pytest.mark.parametrize("zeta, omit_own", list(itertools.product((0, 1, 2), (False, True))))
def test_pm_from_the_fixture_instances_equals_the_reference_procedure(coco_fixture_dir, zeta, omit_own):
    ann_dir = coco_fixture_dir / "annotations"
    captions = json.loads((ann_dir / "captions_val2014.json").read_text())
    instances = json.loads((ann_dir / "instances_val2014.json").read_text())
    image_to_captions = {}
    for cap in captions["annotations"]:
        image_to_captions.setdefault(cap["image_id"], []).append(cap["id"])
    classes = {}
    for inst in instances["annotations"]:
        classes.setdefault(inst["image_id"], set()).add(inst["category_id"])
    assert len(classes) >= 3
    pm = pm_positives_from_instances(
        ann_dir / "instances_val2014.json", image_to_captions, zeta=zeta, omit_own_image=omit_own
    )
    i2t, t2i = reference_pm(classes, image_to_captions, zeta, omit_own)
    assert {k: set(v.tolist()) for k, v in pm.i2t.items()} == i2t
    # The reference keeps captions with an empty match set; they are no query (R = 0): dropped.
    assert {k: set(v.tolist()) for k, v in pm.t2i.items()} == {k: v for k, v in t2i.items() if v}


def test_pm_skips_images_without_instances_and_matches_identical_class_sets():
    image_to_captions = {1: [10, 11], 2: [20], 3: [30], 4: [40]}
    pm = pm_positives({1: [5, 7], 2: [7, 5, 5], 3: [5]}, image_to_captions)  # image 4: none
    assert {k: v.tolist() for k, v in pm.i2t.items()} == {1: [10, 11, 20], 2: [10, 11, 20], 3: [30]}
    assert pm.t2i[11].tolist() == [1, 2] and 40 not in pm.t2i and 4 not in pm.i2t
    near = pm_positives({1: [5, 7], 2: [7, 5, 5], 3: [5]}, image_to_captions, zeta=1)
    assert near.i2t[3].tolist() == [10, 11, 20, 30]


def test_pm_from_instances_reports_bad_files(tmp_path):
    bad = tmp_path / "instances.json"
    bad.write_text(json.dumps({"annotations": [{"image_id": 1}]}))
    with pytest.raises(InputFileError, match="annotation #0 lacks an integer image_id / category_id"):
        pm_positives_from_instances(bad, {1: [10]})
    bad.write_text(json.dumps({"annotations": [{"image_id": 9, "category_id": 1}]}))
    with pytest.raises(InputFileError, match="no instance annotation for any of the 1 images"):
        pm_positives_from_instances(bad, {1: [10]})
    with pytest.raises(InputFileError, match="COCO instances file is missing"):
        pm_positives_from_instances(tmp_path / "nope.json", {1: [10]})
