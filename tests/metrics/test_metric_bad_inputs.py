"""Bad input through the metric modules (`evaluate.load`) raises a clear ValueError naming the
query, instead of being silently coerced by Arrow or failing deep inside with an unrelated error."""

from __future__ import annotations

import warnings
from pathlib import Path

import evaluate
import numpy as np
import pytest

SPACES = Path(__file__).resolve().parents[2] / "evaluate_modules"


@pytest.fixture(scope="module")
def map_at_r():
    return evaluate.load(str(SPACES / "map_at_r"))


@pytest.fixture(scope="module")
def odmap():
    return evaluate.load(str(SPACES / "odmap"))


@pytest.fixture(scope="module")
def itm():
    return evaluate.load(str(SPACES / "itm_score_deltas"))


@pytest.mark.parametrize(
    "predictions, references, message",
    [
        # Arrow's int64 features would score these as [[10, 11, 12]]: mAP@R 1.0.
        ([[10.7, 11.2, 12.0]], [[10, 11, 12]], r"predictions\[0\] \(query 0\) holds 10.7 \(float\)"),
        ([[10, 11, 12], [3, True, 5]], [[10], [1]], r"predictions\[1\] \(query 1\) holds True \(bool\)"),
        ([[10, 11, 12]], [[10.0, 11]], r"references\[0\] \(query 0\) holds 10.0 \(float\)"),
        (np.array([[1.5, 2.0]]), [[1]], "predictions must be .* integer ids, got float64"),
        ([[10, 10, 10]], [[10, 11, 12]], r"ranking of query 0 repeats id 10 \(positions 0 and 1"),
        ([], [], "no queries"),
        (["abc"], [[1]], r"predictions\[0\] \(query 0\) must be a list of integer ids"),
    ],
)
def test_map_at_r_rejects_bad_ids(map_at_r, predictions, references, message):
    with pytest.raises(ValueError, match=message):
        map_at_r.compute(predictions=predictions, references=references, k_values=[1])


def test_duplicates_only_for_parity_runs_and_then_equal_eccv_caption(map_at_r):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        from eccv_caption import _metrics as reference
    rng = np.random.default_rng(0)
    preds = [rng.choice(20, size=12).tolist() for _ in range(40)]  # repeats on purpose
    refs = [rng.choice(20, size=int(rng.integers(1, 6)), replace=False).tolist() for _ in range(40)]
    with pytest.raises(ValueError, match="repeats id"):
        map_at_r.compute(predictions=preds, references=refs, k_values=[1])
    got = map_at_r.compute(predictions=preds, references=refs, k_values=[1], allow_duplicates=True)
    ref = reference.compute_eccv_metrics(dict(enumerate(preds)), dict(enumerate(refs)))
    assert got["map_at_r"] == pytest.approx(ref["eccv_map_at_r"], abs=1e-12)
    assert got["r_precision"] == pytest.approx(ref["eccv_rprecision"], abs=1e-12)
    assert got["recall_at_1"] == pytest.approx(ref["eccv_r1"], abs=1e-12)


def test_similarity_mode_rejects_duplicated_gallery_ids(map_at_r):
    with pytest.raises(ValueError, match="gallery_ids has duplicates"):
        map_at_r.compute(similarity=np.zeros((1, 2)), positives=[[3]], gallery_ids=[3, 3])


MENTIONS = np.array([[True, False], [False, True], [True, True]])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(retrieved=[["a dog"]], removed_classes=["person"], present_classes=[["dog"]]),
            r"removed_classes\[0\] \(query 0\) must be a list of class names, got 'person'",
        ),
        (
            dict(retrieved=[["a dog"]], removed_classes=[["person"]], present_classes="dog"),
            "present_classes must be a list with one entry per query",
        ),
        (
            dict(
                retrieved=[[0, 1]],
                removed_classes=[["cat"]],
                present_classes=[["dog"]],
                mention_matrix=np.array([True, False, True]),
                class_names=["cat", "dog"],
            ),
            r"mention_matrix must be a 2-D \[gallery x classes\] array, got shape \(3,\)",
        ),
        (
            dict(
                retrieved=[["a dog", "a cat"]],
                removed_classes=[["cat"]],
                present_classes=[["dog"]],
                mention_matrix=MENTIONS,
                class_names=["cat", "dog"],
            ),
            r"retrieved\[0\] \(query 0\) holds 'a dog' \(a caption text\); with mention_matrix",
        ),
        (
            dict(
                retrieved=[[0, 1], [1.0, 2]],
                removed_classes=[["cat"]] * 2,
                present_classes=[["dog"]] * 2,
                mention_matrix=MENTIONS,
                class_names=["cat", "dog"],
            ),
            r"retrieved\[1\] \(query 1\) holds 1.0 \(float\)",
        ),
        (
            dict(retrieved=[[0, 1]], removed_classes=[["cat"]], present_classes=[["dog"]]),
            r"retrieved\[0\] \(query 0\) holds 0, not a caption text; gallery indices need mention_matrix",
        ),
        (dict(retrieved=[], removed_classes=[], present_classes=[]), "no queries: retrieved is empty"),
    ],
)
def test_odmap_rejects_bad_inputs(odmap, kwargs, message):
    with pytest.raises(ValueError, match=message):
        odmap.compute(k_values=[1], **kwargs)


def test_odmap_text_mode_without_tagger_names_the_download(odmap, monkeypatch, tmp_path):
    import nltk

    from counterfactory_metrics.odmap.noun_phrases import DOWNLOAD_COMMAND

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    # (The loaded module's own TaggerDataMissing class, a LookupError.)
    with pytest.raises(LookupError, match=DOWNLOAD_COMMAND) as info:
        odmap.compute(retrieved=[["a dog"]], removed_classes=[["person"]], present_classes=[["dog"]], k_values=[1])
    assert type(info.value).__name__ == "TaggerDataMissing"


def test_itm_names_the_missing_columns(itm):
    with pytest.raises(ValueError, match=r"missing score column\(s\) \['g_co_ir', 'g_co_ics'\]"):
        itm.compute(g_cr_ir=[0.9], g_cr_io=[0.1], g_cc_ics=[0.5], g_cc_ios=[0.6])


# ------------------------------------------------------------------ evaluate's step-by-step API
# add/add_batch check like compute and buffer; compute() then scores the buffered batches. Each
# test loads its own module, so no buffered row can leak into another test.


def _load(name):
    return evaluate.load(str(SPACES / name))


def _two_batches_then_compute(name, first, second, **compute_kwargs):
    module = _load(name)
    module.add_batch(**first)
    module.add_batch(**second)
    return module.compute(**compute_kwargs)


def _one_shot(name, first, second, **compute_kwargs):
    joined = {key: list(first[key]) + list(second[key]) for key in first}
    return _load(name).compute(**joined, **compute_kwargs)


def test_map_at_r_add_batch_then_compute_equals_one_shot():
    rng = np.random.default_rng(1)
    preds = [rng.permutation(30)[:12].tolist() for _ in range(20)]
    refs = [rng.choice(30, size=int(rng.integers(1, 8)), replace=False).tolist() for _ in range(20)]
    first, second = dict(predictions=preds[:7], references=refs[:7]), dict(predictions=preds[7:], references=refs[7:])
    got = _two_batches_then_compute("map_at_r", first, second, k_values=[1, 5])
    assert got == _one_shot("map_at_r", first, second, k_values=[1, 5])
    assert got["num_queries"] == 20


def test_map_at_r_add_checks_like_compute_and_buffers_nothing_bad():
    module = _load("map_at_r")
    with pytest.raises(ValueError, match=r"predictions\[0\] \(query 0\) holds 10.7 \(float\)"):
        module.add_batch(predictions=[[10.7, 11.2, 12.0]], references=[[10, 11, 12]])
    with pytest.raises(ValueError, match=r"prediction \(the added query\) holds True \(bool\)"):
        module.add(prediction=[True, 11], reference=[11])
    with pytest.raises(ValueError, match="no queries: pass predictions= and references="):
        module.compute(k_values=[1])
    # The rejected rows were not buffered: they cannot merge into a later computation.
    got = module.compute(predictions=[[1, 2]], references=[[5]], k_values=[1], map_at_r=False, r_precision=False)
    assert got == {"recall_at_1": 0.0, "num_queries": 1}


def test_map_at_r_similarity_mode_stays_compute_only():
    module = _load("map_at_r")
    with pytest.raises(ValueError, match="similarity cannot go through add_batch"):
        module.add_batch(similarity=np.zeros((1, 2)), positives=[[0]])
    module.add(prediction=[10, 11], reference=[10])
    with pytest.raises(ValueError, match="queries buffered with add/add_batch are waiting"):
        module.compute(similarity=np.zeros((1, 2)), positives=[[0]])
    assert module.compute(k_values=[1]) == {"map_at_r": 1.0, "r_precision": 1.0, "recall_at_1": 1.0, "num_queries": 1}


def test_odmap_index_mode_add_batch_then_compute_equals_one_shot():
    rng = np.random.default_rng(2)
    classes = ["cat", "dog", "person", "car"]
    mentions = rng.random((60, len(classes))) < 0.3
    topk = np.stack([rng.permutation(60)[:5] for _ in range(12)])
    removed = [[classes[q % 4]] for q in range(12)]
    present = [[classes[(q + 1) % 4], classes[(q + 2) % 4]] for q in range(12)]
    first = dict(retrieved=topk[:5], removed_classes=removed[:5], present_classes=present[:5])
    second = dict(retrieved=topk[5:], removed_classes=removed[5:], present_classes=present[5:])
    options = dict(mention_matrix=mentions, class_names=classes, k_values=[1, 5])
    got = _two_batches_then_compute("odmap", first, second, **options)
    assert got == _one_shot("odmap", first, second, **options)
    assert got["num_queries"] == 12


def test_odmap_text_mode_add_batch_then_compute_equals_one_shot(nltk_data_dir):
    first = dict(
        retrieved=[["a dog on the grass", "a man with a dog"]], removed_classes=[["person"]], present_classes=[["dog"]]
    )
    second = dict(
        retrieved=[["a man with a dog", "a dog on the grass"]], removed_classes=[["person"]], present_classes=[["dog"]]
    )
    got = _two_batches_then_compute("odmap", first, second, k_values=[1, 2])
    assert got == _one_shot("odmap", first, second, k_values=[1, 2])
    assert got == {"ODmAP@1": 0.5, "ODmAP@2": 0.375, "num_queries": 2}


def test_odmap_add_batch_checks_like_compute_and_buffers_nothing_bad():
    module = _load("odmap")
    common = dict(removed_classes=[["cat"]] * 2, present_classes=[["dog"]] * 2)
    with pytest.raises(ValueError, match=r"retrieved\[1\] \(query 1\) holds 1.0 \(float\)"):
        module.add_batch(retrieved=[[0, 1], [1.0, 2]], **common)
    with pytest.raises(
        ValueError,
        match=r"retrieved\[1\] \(query 1\) holds 2 \(a gallery index\), "
        "but caption texts came first",
    ):
        module.add_batch(retrieved=[["a dog", "a cat"], [2, 0]], **common)
    with pytest.raises(
        ValueError,
        match="add_batch takes retrieved, removed_classes and present_classes only; pass mention_matrix to compute",
    ):
        module.add_batch(
            retrieved=[[0, 1]], removed_classes=[["cat"]], present_classes=[["dog"]], mention_matrix=MENTIONS
        )
    with pytest.raises(ValueError, match="retrieved is missing"):
        module.compute(mention_matrix=MENTIONS, class_names=["cat", "dog"], k_values=[1])
    got = module.compute(
        retrieved=[[1, 2]],
        removed_classes=[["cat"]],
        present_classes=[["dog"]],
        mention_matrix=MENTIONS,
        class_names=["cat", "dog"],
        k_values=[1],
    )
    assert got == {"ODmAP@1": 1.0, "num_queries": 1}


@pytest.mark.slow
def test_odmap_index_mode_rejects_a_repeated_index_unless_allowed():
    module = _load("odmap")
    args = dict(
        retrieved=[[1, 2], [1, 1]],
        removed_classes=[["cat"]] * 2,
        present_classes=[["dog"]] * 2,
        mention_matrix=MENTIONS,
        class_names=["cat", "dog"],
        k_values=[1, 2],
    )
    with pytest.raises(
        ValueError,
        match=r"retrieved\[1\] \(query 1\) repeats gallery index 1 "
        r"\(positions 0 and 1; 1 of 2 rankings",
    ):
        module.compute(**args)
    module.add_batch(retrieved=[[0, 0]], removed_classes=[["dog"]], present_classes=[["cat"]])
    with pytest.raises(ValueError, match=r"retrieved\[0\] \(query 0\) repeats gallery index 0"):
        module.compute(mention_matrix=MENTIONS, class_names=["cat", "dog"], k_values=[1])
    # As given, a repeat counts at each position: caption 1 (dog, no cat) listed twice makes
    # query 1 perfect (AP@2 1.0), while query 0's second caption mentions the cat (AP@2 0.5).
    got = module.compute(**args, allow_duplicates=True)
    assert got == {"ODmAP@1": 1.0, "ODmAP@2": 0.75, "num_queries": 2}


def test_itm_add_batch_then_compute_equals_one_shot():
    rng = np.random.default_rng(3)
    names = ("g_cr_ir", "g_cr_io", "g_co_ir", "g_cc_ics", "g_cc_ios", "g_co_ics")
    scores = {name: rng.normal(size=30).tolist() for name in names}
    first = {name: values[:11] for name, values in scores.items()}
    second = {name: values[11:] for name, values in scores.items()}
    got = _two_batches_then_compute("itm_score_deltas", first, second)
    assert got == _one_shot("itm_score_deltas", first, second)
    assert got["IR_c"]["count"] == 30


def test_itm_add_batch_checks_like_compute_and_buffers_nothing_bad():
    module = _load("itm_score_deltas")
    ok = dict(
        g_cr_ir=[0.9, 0.8],
        g_cr_io=[0.1, 0.2],
        g_co_ir=[0.3, 0.9],
        g_cc_ics=[0.5, 0.4],
        g_cc_ios=[0.6, 0.1],
        g_co_ics=[0.2, 0.5],
    )
    # Arrow's float64 features would read these as 1.0 and 0.2.
    with pytest.raises(ValueError, match=r"g_cr_io\[0\] \(pair 0\) holds True \(bool\)"):
        module.add_batch(**{**ok, "g_cr_io": [True, 0.2]})
    with pytest.raises(ValueError, match=r"g_co_ir\[1\] \(pair 1\) holds '0.9' \(str\)"):
        module.add_batch(**{**ok, "g_co_ir": [0.3, "0.9"]})
    with pytest.raises(ValueError, match=r"missing score column\(s\) \['g_co_ics'\]"):
        module.add_batch(**{k: v for k, v in ok.items() if k != "g_co_ics"})
    with pytest.raises(ValueError, match="add_batch takes the six score columns only; pass bins"):
        module.add_batch(**ok, bins=5)
    assert module.compute(**ok)["IR_r"]["count"] == 2
