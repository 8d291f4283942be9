"""The `map_at_r` evaluate module: local load, docstring examples, parity with the
package functions in every mode, clear errors, and loading it from a Space on the local Hub."""

from __future__ import annotations

import ast
import doctest
import json
from pathlib import Path

import evaluate
import numpy as np
import pytest
import torch

from counterfactory_metrics.map_at_r.retrieval import (
    RetrievalMetricConfig,
    retrieval_scores,
    retrieval_scores_from_similarity,
)
from counterfactory_metrics.map_at_r.eccv_suite import (
    EccvAnnotations,
    EccvSuiteConfig,
    eccv_suite,
    eccv_suite_from_similarity,
)
from loading_scripts.eccv import read_pm_positives

NAME = "map_at_r"
MODULE_DIR = Path(__file__).resolve().parents[2] / "evaluate_modules" / NAME


@pytest.fixture(scope="module")
def metric():
    return evaluate.load(str(MODULE_DIR))


@pytest.fixture(scope="module")
def annotations():
    return EccvAnnotations.load()


def test_docstring_examples_run(metric):
    class LocalEvaluate:  # evaluate.load("map_at_r") in the examples -> this folder
        @staticmethod
        def load(name, **kwargs):
            return evaluate.load(str(MODULE_DIR), **kwargs)

    test = doctest.DocTestParser().get_doctest(metric.inputs_description, {"evaluate": LocalEvaluate}, NAME, None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted >= 5 and result.failed == 0


def test_module_folder_is_complete(metric):
    tree = ast.parse((MODULE_DIR / f"{NAME}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            assert len(node.names) == 1, f"one import per line (evaluate's scanner): line {node.lineno}"
    requirements = (MODULE_DIR / "requirements.txt").read_text().split()
    assert "numpy>=1.24" in requirements and "eccv_caption==0.1.0" in requirements
    assert not any(r.startswith(("counterfactory", "torch")) for r in requirements)
    card = (MODULE_DIR / "README.md").read_text()
    for section in (
        "## Metric description",
        "## How to use",
        "### Inputs",
        "### Output values",
        "## Limitations and bias",
        "## Citation",
    ):
        assert section in card
    assert metric.info.features is not None and metric.citation.strip()


def random_lists(seed, n=80):
    rng = np.random.default_rng(seed)
    refs = [rng.choice(60, size=int(rng.integers(1, 8))).tolist() for _ in range(n)]
    preds = [rng.permutation(60)[:15].tolist() for _ in range(n)]
    return preds, refs


@pytest.mark.parametrize(
    "options",
    [{}, {"k_values": [1, 3], "r_precision_cap": 2}, {"k_values": [2], "map_at_r": False, "r_precision": False}],
)
def test_ranked_lists_equal_the_package_function(metric, options):
    preds, refs = random_lists(1)
    got = metric.compute(predictions=preds, references=refs, **options)
    config = RetrievalMetricConfig(
        k_values=tuple(options.get("k_values", (1, 5, 10))),
        map_at_r=options.get("map_at_r", True),
        r_precision=options.get("r_precision", True),
        r_precision_cap=options.get("r_precision_cap"),
    )
    expected = retrieval_scores(preds, refs, config)
    assert got == {**expected.as_dict(), "num_queries": 80}


def test_similarity_mode_equals_the_package_function(metric):
    rng = np.random.default_rng(2)
    sim = torch.from_numpy(rng.integers(0, 5, size=(300, 2000)).astype(np.float32))  # ties
    gallery_ids = rng.permutation(10**6)[:2000]
    positives = {int(q): rng.choice(gallery_ids, size=4).tolist() for q in range(0, 300, 3)}
    got = metric.compute(similarity=sim, positives=positives, gallery_ids=gallery_ids, k_values=[1, 10])
    expected = retrieval_scores_from_similarity(
        sim, positives, gallery_ids=gallery_ids, config=RetrievalMetricConfig(k_values=(1, 10))
    )
    assert got == {**expected.as_dict(), "num_queries": 100}


@pytest.mark.slow
def test_eccv_mode_from_rankings_and_pm_files(metric, annotations, tmp_path):
    rng = np.random.default_rng(3)
    captions, images = annotations.coco_test_ids, np.array(list(annotations.coco.i2t))
    i2t = {int(i): [int(annotations.coco.i2t[int(i)][0])] + rng.choice(captions, 49).tolist() for i in images}
    t2i = {int(c): [int(annotations.coco.t2i[int(c)][0])] + rng.choice(images, 49).tolist() for c in captions}
    pm_i2t = {int(images[0]): captions[:60].tolist(), int(images[1]): captions[5:8].tolist()}
    pm_t2i = {int(captions[0]): images[:70].tolist()}
    folder = tmp_path / "pm"
    folder.mkdir()
    (folder / "pm_image_to_caption.json").write_text(json.dumps(pm_i2t))
    (folder / "pm_caption_to_image.json").write_text(json.dumps(pm_t2i))
    targets = ["coco_5k_recalls", "cxc_r1", "eccv_map_at_r", "eccv_rprecision", "eccv_r1", "pmrp"]
    # Random fillers may repeat an id: allow_duplicates passes through to the suite.
    got = metric.compute(
        i2t_rankings=i2t, t2i_rankings=t2i, target_metrics=targets, pm_dir=str(folder), allow_duplicates=True
    )
    expected = eccv_suite(
        i2t,
        t2i,
        EccvSuiteConfig(tuple(targets), allow_duplicates=True),
        EccvAnnotations.load(pm=read_pm_positives(folder)),
    )
    assert got == expected
    assert got["coco_5k_r1"] == {"i2t": 1.0, "t2i": 1.0} and set(got["pmrp"]) == {"i2t", "t2i"}


@pytest.mark.slow
def test_eccv_mode_from_a_similarity_matrix(metric, annotations):
    rng = np.random.default_rng(4)
    images = np.array(list(annotations.coco.i2t))
    sim = rng.random((len(images), len(annotations.coco_test_ids)), dtype=np.float32)
    targets = ("coco_1k_r1", "coco_5k_r1", "eccv_map_at_r")
    got = metric.compute(
        i2t_similarity=sim, image_ids=images, caption_ids=annotations.coco_test_ids, target_metrics=targets
    )
    assert got == eccv_suite_from_similarity(
        sim, images, annotations.coco_test_ids, EccvSuiteConfig(targets), annotations
    )
    assert set(got) == {"coco_1k_r1", "coco_5k_r1", "eccv_map_at_r"}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"predictions": [[1, 2]], "references": [[1, 2, 3]], "k_values": [1]},
            "query 0 has 2 items but 3 are needed",
        ),
        ({"predictions": [[1, 2]], "references": [[]]}, "query 0 has no positives"),
        ({"similarity": np.zeros((2, 3)), "positives": [[0]]}, "2 rows but positives has 1"),
        ({"similarity": np.full((1, 2), np.nan), "positives": [[0]]}, "NaN"),
        ({"similarity": np.zeros((1, 2))}, "similarity needs positives"),
        ({"similarity": np.zeros((1, 2)), "positives": [[0]], "predictions": [[0]]}, "not both"),
        ({"i2t_rankings": {1: [2]}}, "needs both i2t_rankings and t2i_rankings"),
        ({"i2t_rankings": {}, "t2i_rankings": {}, "target_metrics": ["map"]}, "unknown target metric"),
        ({"i2t_similarity": np.zeros((1, 1))}, "needs image_ids"),
    ],
)
def test_bad_inputs_raise_value_errors(metric, kwargs, message):
    with pytest.raises(ValueError, match=message):
        metric.compute(**kwargs)


def test_published_space_loads_with_evaluate(local_hub):
    from builders.publishing.metric import MetricPublishConfig, publish_metric

    publish_metric(MetricPublishConfig(f"tester/{NAME}", "v1.0.0", module_dir=MODULE_DIR))
    module = evaluate.load(f"tester/{NAME}", revision="v1.0.0")
    preds, refs = random_lists(5, n=30)
    expected = retrieval_scores(preds, refs)
    assert module.compute(predictions=preds, references=refs) == {**expected.as_dict(), "num_queries": 30}
    sim = np.random.default_rng(6).standard_normal((30, 60))
    got = module.compute(similarity=sim, positives=refs)
    assert got["map_at_r"] == retrieval_scores_from_similarity(sim, refs).map_at_r


def test_pmrp_from_coco_instances_is_wired_to_the_instances_reader(metric, coco_fixture_dir):
    # The fixture's images are not COCO test images: the reader must say so, not crash later.
    with pytest.raises(ValueError, match="no instance annotation for any of the 5000 images"):
        metric.compute(
            i2t_rankings={},
            t2i_rankings={},
            target_metrics=["pmrp"],
            coco_instances=str(coco_fixture_dir / "annotations" / "instances_val2014.json"),
        )
