"""Zero-shot classification with each dataset's own clip-benchmark class names and templates
(issue #34 §4), so the numbers compare with clip-benchmark's: the shipped lists against
independent copies (open_clip's ImageNet lists, CLIP's CIFAR-10 prompts), and `--zeroshot
[BENCHMARK=]DATASET` through `counterfactory train --eval-only` on fixture imagefolders against
class embeddings computed here from the tiny model."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from builders.app.cli import main as cli_main
from builders.devtools.fixtures.classification import CLASSES, write_classification_fixture

from helpers.build_helpers import error_line

#: CLIP's CIFAR-10 prompts (openai/CLIP, data/prompts.md), which clip-benchmark uses.
CIFAR10_TEMPLATES = [
    "a photo of a {}.",
    "a blurry photo of a {}.",
    "a black and white photo of a {}.",
    "a low contrast photo of a {}.",
    "a high contrast photo of a {}.",
    "a bad photo of a {}.",
    "a good photo of a {}.",
    "a photo of a small {}.",
    "a photo of a big {}.",
    "a photo of the {}.",
    "a blurry photo of the {}.",
    "a black and white photo of the {}.",
    "a low contrast photo of the {}.",
    "a high contrast photo of the {}.",
    "a bad photo of the {}.",
    "a good photo of the {}.",
    "a photo of the small {}.",
    "a photo of the big {}.",
]


def test_shipped_lists_equal_independent_copies():
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES

    from training.zeroshot import benchmark_templates, benchmarks

    imagenet = benchmark_templates("imagenet1k")
    assert [t("tench") for t in imagenet] == [t("tench") for t in OPENAI_IMAGENET_TEMPLATES]
    assert benchmarks()["classnames"]["imagenet1k"] == list(IMAGENET_CLASSNAMES)
    assert [t("cat") for t in benchmark_templates("cifar10")] == [t.format("cat") for t in CIFAR10_TEMPLATES]
    # A benchmark without templates of its own takes ImageNet's, as clip-benchmark does.
    assert [t("x") for t in benchmark_templates("caltech101_vtab")] == [t("x") for t in imagenet]
    assert "MIT License" in benchmarks()["license"]


@pytest.fixture(scope="module")
def clip(tiny_models_dir):
    from builders.models.profiles import tiny_profile
    from builders.models.clip_ids import parse_clip_id
    from training.backends import load_backend

    backend = load_backend(parse_clip_id(tiny_profile(tiny_models_dir).clip, "transformers"))
    backend.module.eval()
    return backend


def class_embeddings(backend, classnames, templates) -> np.ndarray:
    """Per class, the renormalised mean of its prompts' normalised text embeddings, one class at a
    time (clip-benchmark's `zero_shot_classifier`)."""
    out = []
    with torch.no_grad():
        for name in classnames:
            txt = backend.module(text=backend.tokenize([t.format(c=name) for t in templates]))[1].numpy()
            mean = txt.mean(0)
            out.append(mean / np.linalg.norm(mean))
    return np.stack(out)


def eval_only(tmp_path, tiny_models_dir, out_name: str, *specs: str) -> list[str]:
    args = [
        "train",
        "--eval-only",
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--num-workers",
        "0",
        "--report-to",
        "none",
        "--output",
        str(tmp_path / out_name),
    ]
    for spec in specs:
        args += ["--zeroshot", spec]
    return args


def test_a_named_benchmark_gets_its_own_prompts(tmp_path, tiny_models_dir, clip):
    """`cifar10=DIR`: CIFAR-10's 18 templates and the dataset's own names as they are (clip-benchmark
    reads torchvision's CIFAR names unchanged, `_` kept); an unnamed folder: CLIP's 80 ImageNet
    templates, `_` read as a space."""
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    classes = write_classification_fixture(tmp_path / "classes", per_class=1)
    shapes = shutil.copytree(classes, tmp_path / "shapes")
    assert cli_main(eval_only(tmp_path, tiny_models_dir, "run", f"cifar10={classes}", str(shapes))) == 0
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["zeroshot_prompts"] == {
        "classes-test": "clip_benchmark:cifar10",
        "shapes-test": "openai_imagenet_templates",
    }
    assert {"zeroshot/classes-test/top1", "zeroshot/shapes-test/top1"} <= set(run["final_metrics"])
    saved = np.load(tmp_path / "run" / "embeddings.npz")
    cifar = [t.replace("{}", "{c}") for t in CIFAR10_TEMPLATES]
    np.testing.assert_allclose(
        saved["zeroshot_classes-test_class"], class_embeddings(clip, sorted(CLASSES), cifar), atol=1e-5
    )
    openai = [t("{c}") for t in OPENAI_IMAGENET_TEMPLATES]
    spaced = [n.replace("_", " ") for n in sorted(CLASSES)]
    np.testing.assert_allclose(saved["zeroshot_shapes-test_class"], class_embeddings(clip, spaced, openai), atol=1e-5)


@pytest.mark.slow
def test_a_folder_named_as_a_benchmark_is_read_as_it(tmp_path, tiny_models_dir, clip):
    classes = write_classification_fixture(tmp_path / "food-101", per_class=1)
    assert cli_main(eval_only(tmp_path, tiny_models_dir, "run", str(classes))) == 0
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["zeroshot_prompts"] == {"food-101-test": "clip_benchmark:food101"}
    saved = np.load(tmp_path / "run" / "embeddings.npz")
    spaced = [n.replace("_", " ") for n in sorted(CLASSES)]
    np.testing.assert_allclose(
        saved["zeroshot_food-101-test_class"],
        class_embeddings(clip, spaced, ["a photo of {c}, a type of food."]),
        atol=1e-5,
    )
    # `openai=` keeps CLIP's 80 ImageNet templates for the same folder.
    assert cli_main(eval_only(tmp_path, tiny_models_dir, "openai", f"openai={classes}")) == 0
    run = json.loads((tmp_path / "openai" / "run.json").read_text())
    assert run["zeroshot_prompts"] == {"food-101-test": "openai_imagenet_templates"}


def test_shipped_class_names_go_by_index_and_a_mismatch_is_one_line(tmp_path, tiny_models_dir, capsys):
    classes = write_classification_fixture(tmp_path / "classes", per_class=1)
    assert cli_main(eval_only(tmp_path, tiny_models_dir, "run", f"caltech101={classes}")) == 2
    line = error_line(capsys)
    assert "--zeroshot" in line and "caltech101" in line and "102" in line and f"{len(CLASSES)} classes" in line
    assert cli_main(eval_only(tmp_path, tiny_models_dir, "run2", f"nosuch={classes}")) == 2
    line = error_line(capsys)
    assert "'nosuch'" in line and "cifar10" in line and "openai=" in line
