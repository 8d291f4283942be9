"""Out-of-range and wrongly shaped input through the metric modules (`evaluate.load`): ids that do
not fit int64, ECCV rankings that are not id lists, a billion histogram bins, a score too large
for a float. Each is a ValueError naming the argument (and the query), raised by compute and by
add/add_batch alike, before anything is buffered, converted or allocated; nothing is silently
wrapped around (2**63 read as -2**63)."""

from __future__ import annotations

from pathlib import Path

import evaluate
import numpy as np
import pytest

SPACES = Path(__file__).resolve().parents[2] / "evaluate_modules"
BIG = 2**63  # one past int64's largest value
INT64 = r"ids must fit int64 \(-2\*\*63 to 2\*\*63 - 1\)"


def load(name):
    return evaluate.load(str(SPACES / name))


@pytest.fixture(scope="module")
def map_at_r():
    return load("map_at_r")


# ------------------------------------------------------------------------------ map_at_r


@pytest.mark.parametrize(
    "predictions, references, message",
    [
        ([[BIG, 1]], [[1]], rf"predictions\[0\] \(query 0\) holds {BIG}; {INT64}"),
        ([[1, 2], [-BIG - 1, 1]], [[1], [1]], rf"predictions\[1\] \(query 1\) holds {-BIG - 1}; {INT64}"),
        ([[1, 2]], [[2**64]], rf"references\[0\] \(query 0\) holds {2**64}; {INT64}"),
        ([[np.uint64(BIG), 1]], [[1]], rf"predictions\[0\] \(query 0\) holds {BIG}; {INT64}"),
        (np.array([[BIG, 1]], dtype=np.uint64), [[1]], rf"predictions holds {BIG}; {INT64}"),
    ],
)
def test_map_at_r_ids_outside_int64(map_at_r, predictions, references, message):
    with pytest.raises(ValueError, match=message):
        map_at_r.compute(predictions=predictions, references=references, k_values=[1])


def test_map_at_r_add_and_add_batch_check_the_bound_and_buffer_nothing():
    module = load("map_at_r")
    with pytest.raises(ValueError, match=rf"prediction \(the added query\) holds {BIG}; {INT64}"):
        module.add(prediction=[BIG, 1], reference=[1])
    with pytest.raises(ValueError, match=rf"references\[1\] \(query 1\) holds {BIG}; {INT64}"):
        module.add_batch(predictions=[[1, 2], [1, 2]], references=[[1], [BIG]])
    with pytest.raises(ValueError, match="no queries"):
        module.compute(k_values=[1])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(k_values=[BIG]), rf"k_values must be positive integers up to 2\*\*63 - 1, got {BIG}"),
        (
            dict(r_precision_cap=BIG),
            rf"r_precision_cap must be a positive integer up to 2\*\*63 - 1, "
            rf"got {BIG}",
        ),
    ],
)
def test_map_at_r_k_values_and_cap_outside_int64(map_at_r, kwargs, message):
    with pytest.raises(ValueError, match=message):
        map_at_r.compute(predictions=[[1, 2]], references=[[2]], **{"k_values": [1], **kwargs})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        # Was read as -2**63: "positive id -9223372036854775808 ... is not among the gallery_ids".
        (dict(positives=[[BIG]]), rf"positives of query 0 holds {BIG}; {INT64}"),
        (dict(positives=[[0]], gallery_ids=[1, BIG]), rf"gallery_ids holds {BIG}; {INT64}"),
        (dict(positives=[[0]], query_ids=[BIG]), rf"query_ids holds {BIG}; {INT64}"),
        (dict(positives={BIG: [0]}, query_ids=[5]), rf"positives holds query id {BIG}; {INT64}"),
    ],
)
def test_similarity_mode_ids_outside_int64(map_at_r, kwargs, message):
    with pytest.raises(ValueError, match=message):
        map_at_r.compute(similarity=np.zeros((1, 2)), k_values=[1], **kwargs)


@pytest.fixture(scope="module")
def eccv_ids():
    from counterfactory_metrics.map_at_r.eccv_suite import EccvAnnotations

    ann = EccvAnnotations.load()
    image, captions = next(iter(ann.coco.i2t.items()))
    return int(image), [int(c) for c in captions], int(captions[0])


@pytest.mark.parametrize(
    "bad, message",
    [
        (5, r"i2t_rankings\[{image}\] must be a list of integer COCO ids \(best first\), got 5"),
        (
            "1 2 3",
            r"i2t_rankings\[{image}\] must be a list of integer COCO ids \(best first\), "
            r"got '1 2 3'",
        ),
        (
            [[1, 2]],
            r"i2t_rankings\[{image}\] must be a list of integer COCO ids \(best first\), "
            r"got \[\[1, 2\]\]",
        ),
        ([1.5, 2.0], r"i2t_rankings\[{image}\] holds 1.5 \(float\); COCO ids are integers"),
        ([True], r"i2t_rankings\[{image}\] holds True \(bool\); COCO ids are integers"),
        ([BIG], rf"i2t_rankings\[{{image}}\] holds {BIG}; {INT64}"),
    ],
)
def test_eccv_rankings_that_are_not_id_lists(map_at_r, eccv_ids, bad, message):
    image, captions, caption = eccv_ids
    with pytest.raises(ValueError, match=message.format(image=image)):
        map_at_r.compute(i2t_rankings={image: bad}, t2i_rankings={caption: [image]})
    with pytest.raises(ValueError, match=message.format(image=caption).replace("i2t", "t2i")):
        map_at_r.compute(i2t_rankings={image: captions}, t2i_rankings={caption: bad})


def test_eccv_ids_outside_int64(map_at_r):
    with pytest.raises(ValueError, match=rf"image_ids holds {BIG}; {INT64}"):
        map_at_r.compute(i2t_similarity=np.zeros((1, 1)), image_ids=[BIG], caption_ids=[1])


# ------------------------------------------------------------------------------ odmap

MENTIONS = np.array([[True, False], [False, True], [True, True]])
INDEX_MODE = dict(mention_matrix=MENTIONS, class_names=["cat", "dog"], k_values=[1])


@pytest.mark.parametrize(
    "retrieved, message",
    [
        ([[BIG, 1]], rf"retrieved\[0\] \(query 0\) holds {BIG}; gallery indices must fit int64"),
        ([[np.uint64(BIG), 1]], rf"retrieved\[0\] \(query 0\) holds {BIG}; gallery indices must fit"),
        (np.array([[BIG, 1]], dtype=np.uint64), rf"retrieved\[0\] \(query 0\) holds {BIG}"),
    ],
)
def test_odmap_gallery_indices_outside_int64(retrieved, message):
    module = load("odmap")
    common = dict(removed_classes=[["cat"]], present_classes=[["dog"]])
    with pytest.raises(ValueError, match=message):
        module.compute(retrieved=retrieved, **common, **INDEX_MODE)
    with pytest.raises(ValueError, match=message):
        module.add_batch(retrieved=retrieved, **common)
    with pytest.raises(ValueError, match=message.replace(r"\[0\] \(query 0\)", r" \(the added query\)")):
        module.add(retrieved=retrieved[0], removed_classes=["cat"], present_classes=["dog"])
    with pytest.raises(ValueError, match="retrieved is missing"):  # nothing was buffered
        module.compute(**INDEX_MODE)


# ------------------------------------------------------------------------------ itm_score_deltas

SCORES = dict(
    g_cr_ir=[0.9, 0.8],
    g_cr_io=[0.1, 0.2],
    g_co_ir=[0.3, 0.9],
    g_cc_ics=[0.5, 0.4],
    g_cc_ios=[0.6, 0.1],
    g_co_ics=[0.2, 0.5],
)


@pytest.mark.parametrize("bins", [10**9, 1_001, 0, -1, 2.5, "auto", True, None])
def test_itm_bins_outside_one_to_a_thousand(tmp_path, bins):
    module = load("itm_score_deltas")
    with pytest.raises(ValueError, match=rf"bins must be an integer from 1 to 1,000, got {bins!r}"):
        module.compute(**SCORES, histogram_path=str(tmp_path / "h.png"), bins=bins)
    assert not (tmp_path / "h.png").exists()
    assert module.compute(**SCORES, bins=1_000)["IR_r"]["count"] == 2  # nothing was buffered


@pytest.mark.parametrize(
    "value, message",
    [
        (10**400, r"g_cr_ir\[0\] \(pair 0\) holds 1000000.*\(int\); scores are finite real numbers"),
        (float("nan"), r"g_cr_ir\[0\] \(pair 0\) holds nan \(float\); scores are finite real numbers"),
        (float("-inf"), r"g_cr_ir\[0\] \(pair 0\) holds -inf \(float\); scores are finite"),
    ],
)
def test_itm_scores_that_are_no_finite_float(value, message):
    module = load("itm_score_deltas")
    with pytest.raises(ValueError, match=message):
        module.compute(**{**SCORES, "g_cr_ir": [value, 0.8]})
    with pytest.raises(ValueError, match=message):
        module.add_batch(**{**SCORES, "g_cr_ir": [value, 0.8]})
    with pytest.raises(ValueError, match=message.replace(r"\[0\] \(pair 0\)", r" \(the added pair\)")):
        module.add(**{name: v[0] for name, v in {**SCORES, "g_cr_ir": [value]}.items()})
    assert module.compute(**SCORES)["IR_r"]["count"] == 2  # nothing bad was buffered


def test_itm_numpy_scores_that_are_not_finite():
    module = load("itm_score_deltas")
    with pytest.raises(ValueError, match=r"g_co_ir\[1\] \(pair 1\) holds inf; scores are finite"):
        module.add_batch(**{**SCORES, "g_co_ir": np.array([0.3, np.inf])})
    assert module.compute(**SCORES)["IR_r"]["count"] == 2
