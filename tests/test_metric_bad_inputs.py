"""Bad input through the metric modules (`evaluate.load`) raises a clear ValueError naming the
query, instead of being silently coerced by Arrow or failing deep inside with an unrelated error."""

from __future__ import annotations

import warnings
from pathlib import Path

import evaluate
import numpy as np
import pytest

SPACES = Path(__file__).resolve().parents[1] / "evaluate_modules"


@pytest.fixture(scope="module")
def map_at_r():
    return evaluate.load(str(SPACES / "map_at_r"))


@pytest.fixture(scope="module")
def odmap():
    return evaluate.load(str(SPACES / "odmap"))


@pytest.fixture(scope="module")
def itm():
    return evaluate.load(str(SPACES / "itm_score_deltas"))


@pytest.mark.parametrize("predictions, references, message", [
    # Arrow's int64 features would score these as [[10, 11, 12]]: mAP@R 1.0.
    ([[10.7, 11.2, 12.0]], [[10, 11, 12]], r"predictions\[0\] \(query 0\) holds 10.7 \(float\)"),
    ([[10, 11, 12], [3, True, 5]], [[10], [1]], r"predictions\[1\] \(query 1\) holds True \(bool\)"),
    ([[10, 11, 12]], [[10.0, 11]], r"references\[0\] \(query 0\) holds 10.0 \(float\)"),
    (np.array([[1.5, 2.0]]), [[1]], "predictions must be .* integer ids, got float64"),
    ([[10, 10, 10]], [[10, 11, 12]], r"ranking of query 0 repeats id 10 \(positions 0 and 1"),
    ([], [], "no queries"),
    (["abc"], [[1]], r"predictions\[0\] \(query 0\) must be a list of integer ids"),
])
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
    got = map_at_r.compute(predictions=preds, references=refs, k_values=[1],
                           allow_duplicates=True)
    ref = reference.compute_eccv_metrics(dict(enumerate(preds)), dict(enumerate(refs)))
    assert got["map_at_r"] == pytest.approx(ref["eccv_map_at_r"], abs=1e-12)
    assert got["r_precision"] == pytest.approx(ref["eccv_rprecision"], abs=1e-12)
    assert got["recall_at_1"] == pytest.approx(ref["eccv_r1"], abs=1e-12)


def test_similarity_mode_rejects_duplicated_gallery_ids(map_at_r):
    with pytest.raises(ValueError, match="gallery_ids has duplicates"):
        map_at_r.compute(similarity=np.zeros((1, 2)), positives=[[3]], gallery_ids=[3, 3])


MENTIONS = np.array([[True, False], [False, True], [True, True]])


@pytest.mark.parametrize("kwargs, message", [
    (dict(retrieved=[["a dog"]], removed_classes=["person"], present_classes=[["dog"]]),
     r"removed_classes\[0\] \(query 0\) must be a list of class names, got 'person'"),
    (dict(retrieved=[["a dog"]], removed_classes=[["person"]], present_classes="dog"),
     "present_classes must be a list with one entry per query"),
    (dict(retrieved=[[0, 1]], removed_classes=[["cat"]], present_classes=[["dog"]],
          mention_matrix=np.array([True, False, True]), class_names=["cat", "dog"]),
     r"mention_matrix must be a 2-D \[gallery x classes\] array, got shape \(3,\)"),
    (dict(retrieved=[["a dog", "a cat"]], removed_classes=[["cat"]], present_classes=[["dog"]],
          mention_matrix=MENTIONS, class_names=["cat", "dog"]),
     r"retrieved\[0\] \(query 0\) holds 'a dog' \(a caption text\); with mention_matrix"),
    (dict(retrieved=[[0, 1], [1.0, 2]], removed_classes=[["cat"]] * 2,
          present_classes=[["dog"]] * 2, mention_matrix=MENTIONS, class_names=["cat", "dog"]),
     r"retrieved\[1\] \(query 1\) holds 1.0 \(float\)"),
    (dict(retrieved=[[0, 1]], removed_classes=[["cat"]], present_classes=[["dog"]]),
     r"retrieved\[0\] \(query 0\) holds 0, not a caption text; gallery indices need mention_matrix"),
    (dict(retrieved=[], removed_classes=[], present_classes=[]), "no queries: retrieved is empty"),
])
def test_odmap_rejects_bad_inputs(odmap, kwargs, message):
    with pytest.raises(ValueError, match=message):
        odmap.compute(k_values=[1], **kwargs)


def test_odmap_text_mode_without_tagger_names_the_download(odmap, monkeypatch, tmp_path):
    import nltk

    from counterfactory_metrics.odmap.noun_phrases import DOWNLOAD_COMMAND

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    # (The loaded module's own TaggerDataMissing class, a LookupError.)
    with pytest.raises(LookupError, match=DOWNLOAD_COMMAND) as info:
        odmap.compute(retrieved=[["a dog"]], removed_classes=[["person"]],
                      present_classes=[["dog"]], k_values=[1])
    assert type(info.value).__name__ == "TaggerDataMissing"


def test_itm_names_the_missing_columns(itm):
    with pytest.raises(ValueError, match=r"missing score column\(s\) \['g_co_ir', 'g_co_ics'\]"):
        itm.compute(g_cr_ir=[0.9], g_cr_io=[0.1], g_cc_ics=[0.5], g_cc_ios=[0.6])
