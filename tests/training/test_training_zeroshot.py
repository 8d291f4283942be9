"""Zero-shot classification and Flickr30k retrieval (training/zeroshot.py) on generated fixtures,
against independent computations from the tiny model's own embeddings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from builders.devtools.fixtures.classification import CLASSES, write_classification_fixture
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_flickr30k_fixture
from training.eval_config import EvalConfig
from training.eval_data import EvalData, load_flickr30k
from training.evaluation import zeroshot_and_flickr30k
from training.sources import DataInputError
from training.zeroshot import load_zeroshot_set, parse_spec, prompt_templates


@pytest.fixture(scope="module")
def backend(tiny_models_dir):
    from builders.models.profiles import tiny_profile
    from builders.models.clip_ids import parse_clip_id
    from training.backends import load_backend

    b = load_backend(parse_clip_id(tiny_profile(tiny_models_dir).clip, "transformers"))
    b.module.eval()
    return b


def _cfg() -> EvalConfig:
    return EvalConfig(num_workers=0, eval_batch_size=8)


def _brute_force_zeroshot(backend, images, classnames, labels):
    """Class embeddings straight from the model, one class at a time, and the ranks by loops."""
    templates = prompt_templates()
    assert len(templates) == 80
    with torch.no_grad():
        cls = []
        for name in classnames:
            txt = backend.module(text=backend.tokenize([t(name) for t in templates]))[1].numpy()
            mean = txt.mean(0)
            cls.append(mean / np.linalg.norm(mean))
    cls = np.stack(cls)
    top1 = top5 = 0
    per_class = {c: [] for c in set(labels.tolist())}
    for emb, label in zip(images, labels, strict=True):
        scores = [float(np.dot(emb, c)) for c in cls]
        rank = sum(s > scores[label] for s in scores)
        top1 += rank == 0
        top5 += rank < 5
        per_class[int(label)].append(rank == 0)
    n = len(labels)
    return cls, {
        "top1": top1 / n,
        "top5": top5 / n,
        "mean_per_class_recall": float(np.mean([np.mean(v) for v in per_class.values()])),
    }


def test_zeroshot_equals_an_independent_computation(tmp_path, backend):
    root = write_classification_fixture(tmp_path / "shapes")
    zs = load_zeroshot_set(str(root))  # split `test` (its folder), the default
    assert zs.classnames == sorted(n.replace("_", " ") for n in CLASSES)
    assert len(zs.examples) == 3 * len(CLASSES)
    emb: dict = {}
    metrics = zeroshot_and_flickr30k(backend.module, backend, EvalData(zeroshot=[zs]), _cfg(), emb)
    images = emb["zeroshot_shapes-test_image"]
    # The image embeddings are the model's own: image 0 encoded directly from its file.
    first = Image.open(root / "test" / sorted(CLASSES)[0] / "0.jpg")
    with torch.no_grad():
        pixels = backend.pixels.per_batch(backend.pixels.per_image()(first.convert("RGB"))[None])
        direct = backend.module(pixel_values=pixels)[0]
    np.testing.assert_allclose(images[0], direct[0].numpy(), atol=1e-5)
    cls, expected = _brute_force_zeroshot(backend, images, zs.classnames, zs.labels)
    np.testing.assert_allclose(emb["zeroshot_shapes-test_class"], cls, atol=1e-5)
    got = {k.rsplit("/", 1)[1]: v for k, v in metrics.items()}
    assert got == pytest.approx(expected)
    assert 0 < got["top5"] < 1  # 7 classes: top-5 is a real test, not always 1


def test_zeroshot_reads_a_classlabel_parquet_dataset(tmp_path):
    import datasets

    images = [{"bytes": _png(i), "path": None} for i in range(4)]
    ds = datasets.Dataset.from_dict(
        {"img": images, "label": [0, 1, 1, 0], "note": list("abcd")},
        features=datasets.Features(
            {
                "img": datasets.Image(),
                "label": datasets.ClassLabel(names=["cat", "tabby_dog"]),
                "note": datasets.Value("string"),
            }
        ),
    )
    (tmp_path / "ds").mkdir()
    ds.to_parquet(tmp_path / "ds" / "test-00000-of-00001.parquet")
    zs = load_zeroshot_set(str(tmp_path / "ds"))
    assert zs.classnames == ["cat", "tabby dog"] and zs.labels.tolist() == [0, 1, 1, 0]


def _png(i: int) -> bytes:
    import io

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(buf, format="PNG")
    return buf.getvalue()


def test_zeroshot_refuses_a_dataset_without_classlabel(tmp_path):
    import datasets

    (tmp_path / "ds").mkdir()
    datasets.Dataset.from_dict(
        {"img": [{"bytes": _png(0), "path": None}], "label": [3]},
        features=datasets.Features({"img": datasets.Image(), "label": datasets.Value("int64")}),
    ).to_parquet(tmp_path / "ds" / "test.parquet")
    with pytest.raises(DataInputError, match="no ClassLabel column"):
        load_zeroshot_set(f"{tmp_path / 'ds'}:test")


def test_spec_parsing(tmp_path):
    assert parse_spec("org/imagenet:validation") == ("org/imagenet", "validation")
    assert parse_spec("org/cifar10") == ("org/cifar10", "test")


def _brute_force_recall(img, txt, owner, image_ids, k):
    i2t = np.mean([any(owner[j] == image_ids[i] for j in np.argsort(-img[i] @ txt.T)[:k]) for i in range(len(img))])
    t2i = np.mean([image_ids[np.argsort(-txt[j] @ img.T)[:k]].tolist().count(owner[j]) > 0 for j in range(len(txt))])
    return i2t, t2i


def test_flickr30k_recall_equals_brute_force(tmp_path, backend):
    root = write_flickr30k_fixture(tmp_path / "f30k", CocoFixtureConfig(n_images=40))
    data = load_flickr30k(str(root), "test")
    assert len(data.image_ids) == 10 and len(data.captions) == 50
    emb: dict = {}
    metrics = zeroshot_and_flickr30k(backend.module, backend, EvalData(flickr30k=data), _cfg(), emb)
    img, txt = emb["flickr30k_image"], emb["flickr30k_text"]
    with torch.no_grad():
        direct = backend.module(text=backend.tokenize(data.captions[:3]))[1].numpy()
    np.testing.assert_allclose(txt[:3], direct, atol=1e-5)
    for k in (1, 5, 10):
        i2t, t2i = _brute_force_recall(img, txt, data.caption_image, data.image_ids, k)
        assert metrics[f"flickr30k/text_retrieval_recall@{k}"] == pytest.approx(i2t)
        assert metrics[f"flickr30k/image_retrieval_recall@{k}"] == pytest.approx(t2i)
    assert 0 < metrics["flickr30k/text_retrieval_recall@1"] < metrics["flickr30k/text_retrieval_recall@10"]


def test_flickr30k_missing_folder_is_one_line(tmp_path):
    with pytest.raises(DataInputError, match="--flickr30k"):
        load_flickr30k(str(tmp_path / "nowhere"), "test")


@pytest.mark.slow
def test_flags_reach_the_evaluation_and_the_saved_embeddings(tmp_path, backend, tiny_models_dir):
    from training.eval_data import load_eval_data
    from training.evaluation import evaluate_model
    from training.options import build_parser, config_from_args

    classes = write_classification_fixture(tmp_path / "classes", per_class=1)
    flickr = write_flickr30k_fixture(tmp_path / "f30k", CocoFixtureConfig(n_images=8))
    args = build_parser().parse_args(
        [
            "--zeroshot",
            f"{classes}:test",
            "--zeroshot",
            str(classes),
            "--flickr30k",
            str(flickr),
            "--eval-only",
            "--models",
            "tiny",
            "--tiny-models-dir",
            str(tiny_models_dir),
            "--num-workers",
            "0",
            "--output",
            str(tmp_path / "run"),
        ]
    )
    cfg = EvalConfig.of(config_from_args(args))  # as the trainer derives it
    data = load_eval_data(cfg, [], [], None)
    assert len(data.zeroshot) == 2 and data.flickr30k is not None
    assert [(r.split, r.rows) for r in data.records] == [("test", len(CLASSES))] * 2 + [("test", 2)]
    metrics = evaluate_model(backend.module, backend, data, cfg, tmp_path / "emb.npz")
    assert {"zeroshot/classes-test/top1", "zeroshot/classes-test/top5", "flickr30k/image_retrieval_recall@10"} <= set(
        metrics
    )
    saved = np.load(tmp_path / "emb.npz")
    assert saved["zeroshot_classes-test_image"].shape[0] == len(CLASSES)
    assert saved["flickr30k_text"].shape[0] == len(data.flickr30k.captions)
