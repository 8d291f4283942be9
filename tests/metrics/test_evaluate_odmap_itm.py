"""The `odmap` and `itm_score_deltas` evaluate modules: load, docstring examples, parity, cards."""

from __future__ import annotations

import ast
import doctest
from pathlib import Path

import evaluate
import numpy as np
import pytest

from counterfactory_metrics.itm_score_deltas.deltas import itm_score_deltas
from counterfactory_metrics.odmap.odmap_scores import odmap_from_topk

REPO_ROOT = Path(__file__).resolve().parents[2]
MODULES = REPO_ROOT / "evaluate_modules"
NAMES = ("odmap", "itm_score_deltas")


def _load(name: str):
    return evaluate.load(str(MODULES / name))


class _LocalEvaluate:
    """Stands in for `evaluate` in the docstring examples: load("odmap") loads the local folder."""

    @staticmethod
    def load(name: str, **kwargs):
        return evaluate.load(str(MODULES / name.split("/")[-1]), **kwargs)


def _run_docstring_examples(name: str) -> doctest.TestResults:
    module = _load(name)
    parser = doctest.DocTestParser()
    test = parser.get_doctest(
        module.inputs_description, {"evaluate": _LocalEvaluate}, f"{name}._KWARGS_DESCRIPTION", None, 0
    )
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    return runner.summarize(verbose=False)


def test_itm_docstring_examples_run():
    result = _run_docstring_examples("itm_score_deltas")
    assert result.attempted >= 3 and result.failed == 0


def test_odmap_docstring_examples_run(nltk_data_dir):
    result = _run_docstring_examples("odmap")
    assert result.attempted >= 4 and result.failed == 0


@pytest.mark.parametrize("name", NAMES)
def test_module_folder_is_complete(name):
    folder = MODULES / name
    source = (folder / f"{name}.py").read_text()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert len(node.names) == 1, f"one import per line: line {node.lineno}"
    requirements = (folder / "requirements.txt").read_text().split()
    assert requirements and not any(r.startswith(("counterfactory", "torch")) for r in requirements)
    card = (folder / "README.md").read_text()
    for section in (
        "## Metric description",
        "## How to use",
        "### Inputs",
        "### Output values",
        "## Limitations and bias",
        "## Citation",
    ):
        assert section in card, f"{name}/README.md lacks {section}"
    module = _load(name)
    assert module.info.features is not None
    assert module.citation.strip() and module.description.strip()


def test_odmap_module_fast_path_equals_package_function():
    rng = np.random.default_rng(5)
    classes = ["cat", "dog", "person", "frisbee", "car"]
    gallery, queries = 400, 50
    mentions = rng.random((gallery, len(classes))) < 0.3
    topk = np.stack([rng.permutation(gallery)[:10] for _ in range(queries)])  # distinct per query
    removed_sets, present_sets = [], []
    for _ in range(queries):
        perm = rng.permutation(len(classes))
        removed_sets.append([classes[i] for i in perm[:1]])
        present_sets.append([classes[i] for i in perm[1:3]])
    removed = np.array([[c in s for c in classes] for s in removed_sets])
    present = np.array([[c in s for c in classes] for s in present_sets])
    expected = odmap_from_topk(topk, mentions, removed, present).as_dict()
    module = _load("odmap")
    got = module.compute(
        retrieved=topk,
        removed_classes=removed_sets,
        present_classes=present_sets,
        mention_matrix=mentions,
        class_names=classes,
    )
    assert got == {**expected, "num_queries": queries}
    got_all = module.compute(
        retrieved=topk.tolist(),
        removed_classes=removed_sets,
        present_classes=present_sets,
        mention_matrix=mentions,
        class_names=classes,
        require_present="all",
        k_values=[1, 10],
    )
    expected_all = odmap_from_topk(topk, mentions, removed, present, k_values=(1, 10), require_present="all").as_dict()
    assert got_all == {**expected_all, "num_queries": queries}


def test_odmap_module_fast_path_defaults_to_the_coco_columns():
    mentions = np.zeros((3, 80), dtype=bool)
    mentions[0, 16] = True  # dog
    mentions[1, 0] = True  # person
    module = _load("odmap")
    got = module.compute(
        retrieved=[[0, 1]],
        removed_classes=[["person"]],
        present_classes=[["dog"]],
        mention_matrix=mentions,
        k_values=[1, 2],
    )
    assert got == {"ODmAP@1": 1.0, "ODmAP@2": 0.5, "num_queries": 1}


def test_odmap_module_bad_inputs_raise_value_errors():
    module = _load("odmap")
    mentions = np.zeros((3, 2), dtype=bool)
    common = dict(removed_classes=[["cat"]], present_classes=[["dog"]], mention_matrix=mentions)
    with pytest.raises(ValueError, match="'unicorn'"):
        module.compute(
            retrieved=[[0, 1]],
            removed_classes=[["unicorn"]],
            present_classes=[["dog"]],
            mention_matrix=mentions,
            class_names=["cat", "dog"],
            k_values=[1],
        )
    with pytest.raises(ValueError, match="k=10 exceeds the ranking length 2"):
        module.compute(retrieved=[[0, 1]], class_names=["cat", "dog"], **common)
    with pytest.raises(ValueError, match="80 class_names|2 columns"):
        module.compute(retrieved=[[0, 1]], k_values=[1], **common)
    with pytest.raises(ValueError, match="no present classes"):
        module.compute(
            retrieved=[[0, 1]],
            removed_classes=[["cat"]],
            present_classes=[[]],
            mention_matrix=mentions,
            class_names=["cat", "dog"],
            k_values=[1],
        )
    with pytest.raises(ValueError, match="'unicorn'"):
        module.compute(
            retrieved=[["a dog", "a cat"]], removed_classes=[["unicorn"]], present_classes=[["dog"]], k_values=[1]
        )


def test_itm_module_equals_package_function_and_writes_the_figure(tmp_path):
    rng = np.random.default_rng(9)
    scores = {
        name: rng.normal(size=200).tolist()
        for name in ("g_cr_ir", "g_cr_io", "g_co_ir", "g_cc_ics", "g_cc_ios", "g_co_ics")
    }
    module = _load("itm_score_deltas")
    got = module.compute(**scores, histogram_path=str(tmp_path / "fig.png"), title="random")
    assert Path(got.pop("histogram_path")).stat().st_size > 10_000
    expected = itm_score_deltas(**scores)
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name] == pytest.approx(expected[name])


def test_itm_module_bad_inputs_raise_value_errors():
    module = _load("itm_score_deltas")
    ok = dict(
        g_cr_ir=[1.0, 2.0],
        g_cr_io=[0.5, 0.1],
        g_co_ir=[0.2, 0.3],
        g_cc_ics=[1.0, 1.0],
        g_cc_ios=[0.4, 1.2],
        g_co_ics=[0.9, 0.0],
    )
    with pytest.raises(ValueError, match="NaN"):
        module.compute(**{**ok, "g_cc_ios": [float("nan"), 1.0]})
    with pytest.raises(ValueError, match="Mismatch in the number"):
        module.compute(**{**ok, "g_co_ir": [0.2]})
