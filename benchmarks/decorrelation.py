"""Throughput of the object-decorrelation builder (run by hand; not part of the test suite).

1. Text stages, no image generation: a large synthetic COCO-format source (annotation JSON only,
   640x480 "images" built from the fixture scenes with jitter) is read with the real reader, then
   timed per stage: the selection rules (`builders.decorrelation.selection`) and selection + `np_removal`
   caption synthesis (NLTK chunking, cached per unique caption). Reported as images/s and rows/s.
2. Image stage with the tiny profile: the fill methods in-process (zero / mean / blur / tiny
   inpainting), the 4 px mask dilation and the CLIP removal check (`--verify-removal`, tiny CLIP,
   80 COCO classes, before + after views of one removal per check), then the whole builder (`--products train`, tiny inpainting) on a fixture as one
   process and as two `accelerate launch` processes, reported as synthetic images per second of
   wall time (launch overhead included, as a user sees it).

Run: `python benchmarks/decorrelation.py [--images 20000] [--build-images 48] [--skip-launch]`
(needs NLTK tagger data: `counterfactory nltk install-offline` or the real download).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from builders.decorrelation.captions import CaptionSynthesizer, CocoPhrases
from builders.decorrelation.config import CaptionConfig, FillConfig, SourceConfig, VerifyConfig
from builders.decorrelation.source import read_source
from builders.devtools.fixtures.coco import CATEGORY_ID, CocoFixtureConfig, write_coco_fixture
from builders.devtools.fixtures.scenes import SCENES
from builders.decorrelation.fill import ImageFiller, dilate
from builders.decorrelation.verify import RemovalVerifier
from builders.decorrelation.selection import select_removals

REPO = Path(__file__).resolve().parents[1]


def write_annotations(root: Path, n_images: int, seed: int = 0, size: tuple[int, int] = (640, 480)) -> None:
    """COCO-format captions/instances/Karpathy JSON (no image files) for `n_images` images."""
    rng = random.Random(seed)
    w, h = size
    images, anns, caps, karpathy = [], [], [], []
    for i in range(n_images):
        scene, image_id = SCENES[i % len(SCENES)], i + 1
        name = f"COCO_train2014_{image_id:012d}.jpg"
        images.append({"id": image_id, "file_name": name, "width": w, "height": h})
        dx, dy = rng.uniform(-0.05, 0.05), rng.uniform(-0.05, 0.05)
        for obj in scene.objects:
            x, y, bw, bh = obj.box
            box = [max(0.0, (x + dx) * w), max(0.0, (y + dy) * h), bw * w, bh * h]
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": image_id,
                    "category_id": CATEGORY_ID[obj.category],
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": obj.iscrowd,
                }
            )
        for text in scene.captions[:5]:
            caps.append({"id": len(caps) + 1, "image_id": image_id, "caption": text})
        karpathy.append({"cocoid": image_id, "filepath": "train2014", "filename": name, "split": "train"})
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    cats = [{"id": cid, "name": name} for name, cid in CATEGORY_ID.items()]
    (root / "annotations/instances_train2014.json").write_text(
        json.dumps({"images": images, "annotations": anns, "categories": cats})
    )
    (root / "annotations/captions_train2014.json").write_text(json.dumps({"images": images, "annotations": caps}))
    (root / "dataset_coco.json").write_text(json.dumps({"images": karpathy}))


def text_stages(n_images: int, tmp: Path) -> dict[str, float]:
    from builders.engine.nltk_setup import ensure_nltk_tagger

    ensure_nltk_tagger()
    write_annotations(tmp / "big", n_images)
    t0 = time.perf_counter()
    records = read_source(SourceConfig("coco", tmp / "big"), ("train",))
    t1 = time.perf_counter()
    selections = [select_removals(r.boxes, r.width, r.height) for r in records]
    t2 = time.perf_counter()
    synth = CaptionSynthesizer(CaptionConfig(), CocoPhrases())
    canvas = None  # np_removal never looks at the image
    rows = 0
    for rec, sel in zip(records, selections, strict=True):
        for k, removal in enumerate(sel.removals):
            made, _ = synth.synthesize(
                rec.captions, removal.removed, removal.present, canvas, random.Random(rec.image_id * 100 + k)
            )
            rows += len(made)
    t3 = time.perf_counter()
    candidates = sum(len(s.removals) for s in selections)
    return {
        "images": len(records),
        "candidates": candidates,
        "rows": rows,
        "read_s": t1 - t0,
        "selection_images_per_s": len(records) / (t2 - t1),
        "selection_plus_caption_rows_per_s": rows / (t3 - t1),
    }


def fill_rates(tiny_dir: Path | None, n: int = 20) -> dict[str, float]:
    from PIL import Image

    from builders.models.profiles import resolve_profile

    rng = np.random.RandomState(0)
    image = Image.fromarray(rng.randint(0, 256, (480, 640, 3)).astype(np.uint8))
    mask = np.zeros((480, 640), bool)
    mask[100:300, 150:400] = True
    out = {}
    inpaint = resolve_profile("tiny", tiny_dir).sd_inpaint
    for method in ("zero", "mean", "blur", "inpaint"):
        filler = ImageFiller(FillConfig(method=method, model=inpaint, steps=2, image_size=64))
        filler.fill(image, mask, 0)  # warm-up (model load)
        t = time.perf_counter()
        for s in range(n):
            filler.fill(image, mask, s)
        out[f"{method}_images_per_s"] = n / (time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(n):
        dilate(mask, 4)
    out["dilation_4px_masks_per_s"] = n / (time.perf_counter() - t)
    verifier = RemovalVerifier(
        VerifyConfig(enabled=True, model=resolve_profile("tiny", tiny_dir).clip_filter),
        SourceConfig("coco", Path(".")).class_names,
    )
    verifier.check(image, image, mask, ("dog",))  # warm-up (model load)
    t = time.perf_counter()
    for _ in range(n):
        verifier.check(image, image, mask, ("dog",))
    out["removal_check_per_s"] = n / (time.perf_counter() - t)
    out["removal_check / tiny inpaint time"] = out["inpaint_images_per_s"] / out["removal_check_per_s"]
    return out


def builder_runs(n_images: int, tiny_dir: Path | None, tmp: Path, launch: bool) -> dict[str, float]:
    root = write_coco_fixture(tmp / "fixture", CocoFixtureConfig(n_images=n_images))
    common = [
        "--coco-root",
        str(root),
        "--products",
        "train",
        "--models",
        "tiny",
        "--image-size",
        "64",
        "--inpaint-steps",
        "2",
        "--part-size",
        "4",
    ]
    if tiny_dir:
        common += ["--tiny-models-dir", str(tiny_dir)]
    script = str(REPO / "builders/decorrelation/builder.py")
    runs = {"1 process": [sys.executable, script]}
    if launch:
        accelerate = str(Path(sys.executable).parent / "accelerate")
        runs["2 processes"] = [
            accelerate,
            "launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            script,
            "--expect-processes",
            "2",
        ]
    out = {}
    for name, cmd in runs.items():
        dest = tmp / name.replace(" ", "_")
        t = time.perf_counter()
        subprocess.run([*cmd, *common, "--output", str(dest)], check=True, capture_output=True)
        wall = time.perf_counter() - t
        rows = json.loads((dest / "build_manifest.json").read_text())["outputs"]["default/train"]["rows"]
        out[f"{name}: images_per_s"] = rows / wall
        out[f"{name}: wall_s"] = wall
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000, help="images of the synthetic text-stage source")
    parser.add_argument("--build-images", type=int, default=48, help="fixture images for the builder runs")
    parser.add_argument("--tiny-models-dir", type=Path, default=None)
    parser.add_argument("--skip-launch", action="store_true", help="skip the 2-process accelerate run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        results = {
            "text stages": text_stages(args.images, Path(tmp)),
            "fill (640x480, in-process)": fill_rates(args.tiny_models_dir),
            "builder (tiny inpainting)": builder_runs(
                args.build_images, args.tiny_models_dir, Path(tmp), not args.skip_launch
            ),
        }
    for section, values in results.items():
        print(f"== {section}")
        for key, value in values.items():
            print(f"  {key:40s} {value:12.2f}" if isinstance(value, float) else f"  {key:40s} {value:12d}")


if __name__ == "__main__":
    main()
