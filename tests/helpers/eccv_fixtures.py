"""The real ECCV Caption annotations shipped in `eccv_caption`, read with `json`, and a COCO root
holding the real test images they name."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image


FILES = {"eccv": "eccv", "cxc": "cxc", "coco": "original"}


def package_json(source: str, direction: str) -> dict[int, list[int]]:
    import eccv_caption

    name = {"i2t": "image_to_caption", "t2i": "caption_to_image"}[direction]
    path = Path(eccv_caption.__file__).parent / "data" / f"{FILES[source]}_{name}.json"
    return {int(k): [int(x) for x in v] for k, v in json.loads(path.read_text()).items()}


def write_test_image_root(root: Path, classes: dict[int, list[int]]) -> Path:
    """A COCO root holding the real test images `classes` names (tiny JPEGs, captions
    "caption <id>" with their real ids, one made-up box per class in `classes[image]`, classes
    1-4): the fixture's made-up ids would leave every row of the build without a text or image."""
    coco_i2t = package_json("coco", "i2t")
    images = sorted(classes)
    (root / "val2014").mkdir(parents=True)
    (root / "annotations").mkdir()
    entries = []
    for i in images:
        name = f"COCO_val2014_{i:012d}.jpg"
        Image.new("RGB", (8, 6), (i % 255, 0, 0)).save(root / "val2014" / name)
        entries.append({"id": i, "file_name": name, "width": 8, "height": 6})
    caps = [{"id": c, "image_id": i, "caption": f"caption {c}"} for i in images for c in coco_i2t[i]]
    inst = [
        {"id": n, "image_id": i, "category_id": c, "bbox": [0, 0, 2, 2], "area": 4, "iscrowd": 0}
        for n, (i, c) in enumerate((i, c) for i in images for c in classes[i])
    ]
    cats = [{"id": c, "name": f"class{c}", "supercategory": "x"} for c in (1, 2, 3, 4)]
    (root / "annotations" / "captions_val2014.json").write_text(json.dumps({"images": entries, "annotations": caps}))
    (root / "annotations" / "instances_val2014.json").write_text(
        json.dumps({"images": entries, "annotations": inst, "categories": cats})
    )
    return root
