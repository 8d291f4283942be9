"""Inputs of the decorrelation builds: the raw fixture JSON as the tests read it, the build's flags,
Flickr30k Entities files."""

from __future__ import annotations

import json
from pathlib import Path

from builders.devtools.fixtures.coco import CocoFixtureConfig, write_flickr30k_fixture


PART_SIZE = "2"


def raw_images(root: Path) -> dict[int, dict]:
    """Image id -> split, file, size, boxes, {caption id: text}, straight from the JSON files."""
    karpathy = {e["cocoid"]: e for e in json.loads((root / "dataset_coco.json").read_text())["images"]}
    out: dict[int, dict] = {}
    for path in sorted((root / "annotations").glob("instances_*.json")):
        data = json.loads(path.read_text())
        cats = {c["id"]: c["name"] for c in data["categories"]}
        for im in data["images"]:
            k = karpathy[im["id"]]
            out[im["id"]] = {
                "split": k["split"],
                "file": root / k["filepath"] / k["filename"],
                "w": im["width"],
                "h": im["height"],
                "boxes": [],
                "captions": {},
            }
        for a in data["annotations"]:
            out[a["image_id"]]["boxes"].append((cats[a["category_id"]], tuple(a["bbox"])))
    for path in (root / "annotations").glob("captions_*.json"):
        for a in json.loads(path.read_text())["annotations"]:
            out[a["image_id"]]["captions"][a["id"]] = a["caption"]
    return out


def build_args(root: Path, out: Path, tiny_dir: Path, *extra: str) -> list[str]:
    return [
        "--coco-root",
        str(root),
        "--output",
        str(out),
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_dir),
        "--image-size",
        "64",
        "--inpaint-steps",
        "2",
        "--part-size",
        PART_SIZE,
        *extra,
    ]


def flickr_entities(root: Path) -> None:
    """Flickr30k Entities files for the Flickr30k fixture: a person and a dog side by side."""
    write_flickr30k_fixture(root, CocoFixtureConfig(n_images=10))
    (root / "flickr30k_entities/Sentences").mkdir(parents=True)
    (root / "flickr30k_entities/Annotations").mkdir(parents=True)
    for entry in json.loads((root / "dataset_flickr30k.json").read_text())["images"]:
        stem = Path(entry["filename"]).stem
        lines = [
            "[/EN#1/people A man] walks with [/EN#2/animals a small dog] .",
            "[/EN#2/animals A dog] follows [/EN#1/people a woman] in [/EN#3/scene the park] .",
            "[/EN#1/people Someone] and [/EN#2/animals a puppy] .",
            "[/EN#1/people A person] outside .",
            "[/EN#3/scene A sunny day] .",
        ]
        (root / f"flickr30k_entities/Sentences/{stem}.txt").write_text("\n".join(lines) + "\n")
        objects = "".join(
            f"<object><name>{n}</name><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin>"
            f"<xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object>"
            for n, (x0, y0, x1, y1) in ((1, (5, 10, 45, 80)), (2, (70, 40, 120, 90)))
        )
        (root / f"flickr30k_entities/Annotations/{stem}.xml").write_text(
            f"<annotation><size><width>128</width><height>96</height><depth>3</depth></size>{objects}"
            "<object><name>3</name><scene>1</scene></object></annotation>"
        )
