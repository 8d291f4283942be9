"""The tiny COCO fixture and the COCO reader: determinism, the scene properties builders rely on,
agreement of the reader with the raw JSON, and clear errors on corrupt input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from builders.app.cli import main as cli_main
from builders.engine.errors import InputFileError
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture, write_flickr30k_fixture
from loading_scripts.coco import CocoSourceConfig, read_coco
from loading_scripts.images import open_rgb_image


def tree_digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def box_overlap(a, b) -> float:
    """area(a ∩ b) / area(b), boxes as x, y, w, h."""
    w = max(0.0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    return w * h / (b[2] * b[3])


def test_cli_writes_deterministic_fixture(tmp_path):
    assert cli_main(["fixture", "coco", str(tmp_path / "a"), "--images", "12", "--seed", "3"]) == 0
    assert cli_main(["fixture", "coco", str(tmp_path / "b"), "--images", "12", "--seed", "3"]) == 0
    write_coco_fixture(tmp_path / "c", CocoFixtureConfig(n_images=12, seed=4))
    a, b, c = (tree_digest(tmp_path / x) for x in "abc")
    assert a == b
    assert a != c and len(a) == len(c)
    assert sum(k.endswith(".jpg") for k in a) == 12


def test_fixture_has_the_cases_builders_need(coco_fixture_dir):
    raw = {
        s: json.loads((coco_fixture_dir / "annotations" / f"instances_{s}.json").read_text())
        for s in ("train2014", "val2014")
    }
    cats = {c["id"]: c["name"] for c in raw["val2014"]["categories"]}
    assert len(cats) == 80 and max(cats) == 90  # real COCO ids, with gaps
    by_image: dict[int, list] = {}
    sizes = {}
    for data in raw.values():
        sizes.update({im["id"]: (im["width"], im["height"]) for im in data["images"]})
        for ann in data["annotations"]:
            by_image.setdefault(ann["image_id"], []).append(ann)
    huge = tiny = nested = crowd = single = 0
    for image_id, anns in by_image.items():
        w, h = sizes[image_id]
        for ann in anns:
            x, y, bw, bh = ann["bbox"]
            assert 0 <= x and 0 <= y and x + bw <= w + 1e-6 and y + bh <= h + 1e-6
            huge += bw * bh / (w * h) > 0.7
            tiny += bw * bh < 32
            crowd += ann["iscrowd"]
            nested += any(
                o is not ann and o["category_id"] != ann["category_id"] and box_overlap(o["bbox"], ann["bbox"]) > 0.8
                for o in anns
            )
        single += len({a["category_id"] for a in anns}) == 1
    assert huge and tiny and nested and crowd and single
    # Objects are really drawn at their boxes: the box interior differs from the background.
    img_meta = raw["val2014"]["images"][0]
    pixels = np.asarray(Image.open(coco_fixture_dir / "val2014" / img_meta["file_name"]), dtype=float)
    ann = by_image[img_meta["id"]][-1]
    x, y, bw, bh = (int(round(v)) for v in ann["bbox"])
    inside = pixels[y + 2 : y + bh - 2, x + 2 : x + bw - 2].mean(axis=(0, 1))
    assert np.abs(inside - pixels[y + 2 : y + bh - 2, :2].mean(axis=(0, 1))).max() > 5


def test_read_coco_agrees_with_raw_json(coco_fixture_dir):
    karpathy = json.loads((coco_fixture_dir / "dataset_coco.json").read_text())["images"]
    assert {e["split"] for e in karpathy} == {"train", "restval", "val", "test"}
    records = read_coco(CocoSourceConfig(coco_fixture_dir, karpathy_splits=("test",)))
    expected_ids = sorted(e["cocoid"] for e in karpathy if e["split"] == "test")
    assert [r.image_id for r in records] == expected_ids
    caps = json.loads((coco_fixture_dir / "annotations" / "captions_val2014.json").read_text())
    for rec in records:
        assert rec.path.is_file() and rec.split == "test" and rec.path.parent.name == rec.folder
        assert sorted(c.text for c in rec.captions) == sorted(
            a["caption"] for a in caps["annotations"] if a["image_id"] == rec.image_id
        )
        assert len(rec.captions) == 5 and rec.objects
    everything = read_coco(CocoSourceConfig(coco_fixture_dir))
    assert len(everything) == len(karpathy)


def test_read_coco_records_agree_with_instances_and_pixels(coco_fixture_dir):
    records = {r.image_id: r for r in read_coco(CocoSourceConfig(coco_fixture_dir))}
    inst = json.loads((coco_fixture_dir / "annotations" / "instances_val2014.json").read_text())
    cats = {c["id"]: c["name"] for c in inst["categories"]}
    for meta in inst["images"]:
        rec = records[meta["id"]]
        assert rec.folder == "val2014" and (rec.width, rec.height) == (meta["width"], meta["height"])
        assert open_rgb_image(rec.path).size == (rec.width, rec.height) == (128, 96)
        anns = sorted((a for a in inst["annotations"] if a["image_id"] == meta["id"]), key=lambda a: a["id"])
        assert [(o.object_id, o.category, o.category_id, list(o.bbox), o.area, o.iscrowd) for o in rec.objects] == [
            (a["id"], cats[a["category_id"]], a["category_id"], a["bbox"], a["area"], a["iscrowd"]) for a in anns
        ]
    caption_splits = read_coco(
        CocoSourceConfig(coco_fixture_dir, karpathy_splits=("test", "val"), with_instances=False)
    )
    assert {r.split for r in caption_splits} == {"test", "val"}
    assert all(not r.objects for r in caption_splits)


def test_flickr30k_fixture(tmp_path):
    root = write_flickr30k_fixture(tmp_path / "f30k", CocoFixtureConfig(n_images=6))
    data = json.loads((root / "dataset_flickr30k.json").read_text())
    assert len(data["images"]) == 6
    for entry in data["images"]:
        assert open_rgb_image(root / "flickr30k-images" / entry["filename"]).size == (128, 96)
        assert len(entry["sentences"]) == 5


@pytest.fixture
def fixture_copy(tmp_path) -> Path:
    return write_coco_fixture(tmp_path / "coco", CocoFixtureConfig(n_images=12))


def test_malformed_json_names_file_and_position(fixture_copy):
    path = fixture_copy / "annotations" / "captions_val2014.json"
    path.write_text(path.read_text()[:200])
    with pytest.raises(InputFileError, match=r"captions_val2014.json: malformed JSON at line \d+"):
        read_coco(CocoSourceConfig(fixture_copy))


def test_missing_annotation_file_names_it_and_the_fix(fixture_copy):
    (fixture_copy / "annotations" / "instances_train2014.json").unlink()
    with pytest.raises(
        InputFileError,
        match="instances_train2014.json: instances file is missing "
        r"\(download COCO",
    ):
        read_coco(CocoSourceConfig(fixture_copy))
    assert read_coco(CocoSourceConfig(fixture_copy, with_instances=False))


def test_annotation_row_without_bbox_is_named(fixture_copy):
    path = fixture_copy / "annotations" / "instances_val2014.json"
    data = json.loads(path.read_text())
    del data["annotations"][3]["bbox"]
    path.write_text(json.dumps(data))
    ann = data["annotations"][3]
    # One malformed row marks its image (skipped and counted by builders); the rest reads fine.
    records = {r.image_id: r for r in read_coco(CocoSourceConfig(fixture_copy))}
    problem = records[ann["image_id"]].input_problem
    assert problem is not None and problem.reason == "bad_annotation"
    assert (
        f"instances_val2014.json: annotation id {ann['id']} of image {ann['image_id']} lacks "
        "['bbox']" == problem.detail
    )
    assert all(r.input_problem is None for i, r in records.items() if i != ann["image_id"])


def test_unreadable_and_missing_images(fixture_copy):
    rec = read_coco(CocoSourceConfig(fixture_copy))[0]
    rec.path.write_bytes(rec.path.read_bytes()[:100])
    with pytest.raises(InputFileError, match=f"{rec.path.name}: cannot decode the image"):
        open_rgb_image(rec.path)
    rec.path.unlink()
    with pytest.raises(InputFileError, match="image file is missing"):
        open_rgb_image(rec.path)


def test_unknown_karpathy_split(fixture_copy):
    with pytest.raises(InputFileError, match="unknown Karpathy split"):
        read_coco(CocoSourceConfig(fixture_copy, karpathy_splits=("testing",)))


def test_flickr30k_reader_rejects_repeated_images_and_marks_bad_captions(tmp_path):
    from loading_scripts.flickr30k import Flickr30kSourceConfig, read_flickr30k

    root = write_flickr30k_fixture(tmp_path / "f30k", CocoFixtureConfig(n_images=6))
    path = root / "dataset_flickr30k.json"
    data = json.loads(path.read_text())
    data["images"][2]["sentences"][1]["raw"] = None
    path.write_text(json.dumps(data))
    records = {r.image_id: r for r in read_flickr30k(Flickr30kSourceConfig(root))}
    bad = int(Path(data["images"][2]["filename"]).stem)
    assert records[bad].input_problem.reason == "bad_caption"
    assert [i for i, r in records.items() if r.input_problem] == [bad]

    data["images"].append(dict(data["images"][4]))
    path.write_text(json.dumps(data))
    with pytest.raises(InputFileError, match=r"image entries #4 and #6 are both image \d+"):
        read_flickr30k(Flickr30kSourceConfig(root))


def test_flickr30k_entities_box_that_is_not_a_box_is_named(tmp_path):
    from loading_scripts.flickr30k import Flickr30kSourceConfig, read_flickr30k

    root = write_flickr30k_fixture(tmp_path / "f30k", CocoFixtureConfig(n_images=2))
    (root / "flickr30k_entities/Sentences").mkdir(parents=True)
    (root / "flickr30k_entities/Annotations").mkdir(parents=True)
    for entry in json.loads((root / "dataset_flickr30k.json").read_text())["images"]:
        stem = Path(entry["filename"]).stem
        (root / f"flickr30k_entities/Sentences/{stem}.txt").write_text(
            "\n".join(["[/EN#1/people A man] walks ."] * len(entry["sentences"])) + "\n"
        )
        (root / f"flickr30k_entities/Annotations/{stem}.xml").write_text(
            "<annotation><object><name>1</name><bndbox><xmin>5</xmin><ymin>nan</ymin>"
            "<xmax>40</xmax><ymax>30</ymax></bndbox></object></annotation>"
        )
    with pytest.raises(InputFileError, match=r"\.xml: a bndbox is not a box \(xmin 5.0, ymin nan"):
        read_flickr30k(Flickr30kSourceConfig(root))
