"""Fixtures and helpers shared by the ECCV machine-in-the-loop tests (test_eccv_positives_mitl.py,
test_eccv_positives_ingest.py): a fixture gallery, two tiny machine annotators, one candidates +
tasks round and its full-matrix reference scores, and tiny cross-encoders drawn wide enough to rank
(`spread`), each built once per test session (registered in conftest.py).

conftest.py loads this module in every session, whatever tests are selected, so it imports no HF
library (conftest.py sets their environment first) and no torch at module level.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from builders.app.cli import main as cli_main

ANSWERS = ("100% YES", "Partially YES, but", "Mostly NO, because", "100% NO")
YES, NO = ANSWERS[:2], ANSWERS[2:]


@pytest.fixture(scope="session")
def gallery(tmp_path_factory):
    """A 60-image COCO fixture; the gallery is all of it (all Karpathy splits)."""
    from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture

    root = tmp_path_factory.mktemp("mitl") / "coco"
    write_coco_fixture(root, CocoFixtureConfig(n_images=60, seed=5))
    images, captions = {}, []
    for split in ("train2014", "val2014"):
        data = json.loads((root / "annotations" / f"captions_{split}.json").read_text())
        images.update({im["id"]: root / split / im["file_name"] for im in data["images"]})
        captions += [(a["image_id"], a["id"], a["caption"].strip()) for a in data["annotations"]]
    captions.sort()
    return {
        "root": root,
        "image_ids": sorted(images),
        "paths": [images[i] for i in sorted(images)],
        "caption_ids": [c for _, c, _ in captions],
        "caption_image": {c: i for i, c, _ in captions},
        "texts": [t for _, _, t in captions],
    }


@pytest.fixture(scope="session")
def annotators(tiny_models_dir):
    from builders.models.tiny import build_tiny_models

    paths = build_tiny_models(tiny_models_dir)
    return [str(paths["clip"]), f"local-dir:{paths['open_clip']}"]


def brute_force_scores(model_id: str, gallery) -> tuple[np.ndarray, np.ndarray]:
    """Full [images x captions] similarity with each library's documented calls, one batch."""
    import torch
    from PIL import Image

    images = [Image.open(p).convert("RGB") for p in gallery["paths"]]
    with torch.no_grad():
        if model_id.startswith("local-dir:"):
            import open_clip

            model, _, preprocess = open_clip.create_model_and_transforms(model_id)
            model.eval()
            img = model.encode_image(torch.stack([preprocess(im) for im in images]))
            txt = model.encode_text(open_clip.get_tokenizer(model_id)(gallery["texts"]))
        else:
            from transformers import CLIPModel, CLIPProcessor

            model, proc = CLIPModel.from_pretrained(model_id).eval(), CLIPProcessor.from_pretrained(model_id)
            img = model.get_image_features(pixel_values=proc(images=images, return_tensors="pt")["pixel_values"])
            txt = model.get_text_features(
                **proc(text=gallery["texts"], return_tensors="pt", padding=True, truncation=True)
            )
            img, txt = (getattr(x, "pooler_output", x) for x in (img, txt))
    img = torch.nn.functional.normalize(img.float(), dim=-1)
    txt = torch.nn.functional.normalize(txt.float(), dim=-1)
    # A caption text repeated in the gallery is one model input, so one score: its copies tie
    # exactly and rank by gallery index (builders/eccv_positives/METHOD.md §2), whatever rounding the product gives them.
    first: dict[str, int] = {}
    same = [first.setdefault(t, n) for n, t in enumerate(gallery["texts"])]
    return (img @ txt.T).numpy()[:, same], (txt @ img.T).numpy()[same]


@pytest.fixture(scope="session")
def spread(tiny_families_dir, tmp_path_factory):
    """family -> a copy of the tiny model drawn with weights 10x wider (initializer_range 0.2): the
    tiny models' default draw scores every pair within ~1e-3 of each other, too alike for a
    ranking test to tell one ranking rule from another."""
    import torch
    import transformers

    out = {}
    for family, cls in (
        ("blip", "BlipForImageTextRetrieval"),
        ("flava", "FlavaForPreTraining"),
        ("flava-itc", "FlavaModel"),
        ("vilt", "ViltForImageAndTextRetrieval"),
    ):
        config = transformers.AutoConfig.from_pretrained(tiny_families_dir / family)
        for part in (config, *(getattr(config, n) for n in config.sub_configs)):
            part.initializer_range = 0.2
        torch.manual_seed(0)
        out[family] = tmp_path_factory.mktemp("spread") / family
        getattr(transformers, cls)(config).save_pretrained(out[family])
        transformers.AutoProcessor.from_pretrained(tiny_families_dir / family).save_pretrained(out[family])
    return out


def round_args(image_queries: int, caption_queries: int, seed: int) -> list[str]:
    """`eccv candidates`' sampling: queries from every split of the fixture gallery."""
    splits = ["--splits", "train", "restval", "val", "test"]
    return [
        *splits,
        "--image-queries",
        str(image_queries),
        "--caption-queries",
        str(caption_queries),
        "--seed",
        str(seed),
    ]


@pytest.fixture(scope="session")
def round_dir(tmp_path_factory, gallery, annotators):
    run = tmp_path_factory.mktemp("round")
    args = [
        "eccv",
        "candidates",
        "--coco-root",
        str(gallery["root"]),
        *round_args(10, 14, 1),
        "--batch-size",
        "1000",
        "--cache-dir",
        str(run / "cache"),
        "--output",
        str(run / "candidates.json"),
    ]
    for model in annotators:
        args += ["--model", model]
    assert cli_main(args) == 0
    assert (
        cli_main(["eccv", "tasks", str(run / "candidates.json"), "--output", str(run / "tasks"), "--seed", "7"]) == 0
    )
    return run


@pytest.fixture(scope="session")
def brute(gallery, annotators):
    return {m: brute_force_scores(m, gallery) for m in annotators}


def ranked(scores: np.ndarray, row: int, ids: list[int], k: int) -> list[int]:
    return [ids[j] for j in np.argsort(-scores[row], kind="stable")[:k]]


def write_csv(path: Path, rows: list[tuple[str, str, str, str]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task_id", "item_id", "worker_id", "answer"])
        w.writerows(rows)
    return path


def no_model(model_id: str, device: str = "cpu", backend: str | None = None, dtype: str = "fp32"):
    """A `builders.models.clip.load_scorer` that must not be called."""
    raise AssertionError(f"{model_id} was loaded although its embeddings are cached")
