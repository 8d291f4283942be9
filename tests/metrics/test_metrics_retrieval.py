"""The mAP@R family: evaluate_modules/map_at_r/README.md (ECCV Caption paper, Chun et al. 2022, §4) worked examples, a brute-force reference, eccv_caption parity."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch

from counterfactory_metrics.map_at_r.retrieval import (
    RetrievalInputError,
    RetrievalMetricConfig,
    ranking_depth,
    retrieval_scores,
    retrieval_scores_from_similarity,
    retrieval_scores_from_topk,
)
import counterfactory_metrics.map_at_r.topk as topk_module
from counterfactory_metrics.map_at_r.topk import as_score_matrix, stable_topk

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # eccv_caption warns that ujson is missing
    from eccv_caption import _metrics as reference


# ----------------------------------------------------------------------------- brute force


def brute_force(ranking, positives, k_values=(1, 5, 10), cap=None):
    """One query, straight from the definitions in evaluate_modules/map_at_r/README.md (ECCV Caption paper, Chun et al. 2022, §4) (a Python loop, no numpy)."""
    gt = set(positives)
    r = len(gt)

    def precision_at(n):
        top = set(ranking[:n])
        return len(top & gt) / len(top)

    ap = sum(precision_at(n) for n in range(1, r + 1) if ranking[n - 1] in gt) / r
    rp = precision_at(r if cap is None else min(r, cap))
    recalls = {k: float(any(item in gt for item in ranking[:k])) for k in k_values}
    return ap, rp, recalls


def brute_force_means(rankings, positives, k_values=(1, 5, 10), cap=None):
    per = [brute_force(t, g, k_values, cap) for t, g in zip(rankings, positives, strict=True)]
    return (
        sum(p[0] for p in per) / len(per),
        sum(p[1] for p in per) / len(per),
        {k: sum(p[2][k] for p in per) / len(per) for k in k_values},
    )


def random_case(rng, n_queries, id_space, max_pos=6, extra=0):
    """Rankings with duplicates and positives with duplicates over a small id space."""
    positives, rankings = [], []
    for _ in range(n_queries):
        pos = rng.choice(id_space, size=int(rng.integers(1, max_pos + 1))).tolist()
        r = len(set(pos))
        length = max(r, 10) + int(rng.integers(0, extra + 1))
        rankings.append(rng.choice(id_space, size=length).tolist())
        positives.append(pos)
    return rankings, positives


# ----------------------------------------------------------------------------- worked examples

EIGHT = list(range(8))
NEG = list(range(100, 120))


@pytest.mark.parametrize(
    "ranking, expected_ap, expected_r1",
    [
        ([99] + EIGHT + NEG, 0.660, 0.0),  # (A) only the top-1 wrong
        ([0] + NEG, 0.125, 1.0),  # (B) only the top-1 right
        (NEG[:5] + EIGHT, 0.103, 0.0),  # (C) top-1..5 wrong, the rest right
        (NEG[:4] + [0] + NEG[4:], 0.025, 0.0),  # (D) only the 5th right
    ],
)
def test_worked_examples_with_eight_positives(ranking, expected_ap, expected_r1):
    s = retrieval_scores([ranking], [EIGHT])
    assert round(s.map_at_r, 3) == expected_ap
    assert s.recall_at_k[1] == expected_r1


def test_worked_examples_with_three_positives():
    s = retrieval_scores(
        {"a": [10, 99, 11, 12], "b": [99, 10, 11]},
        {"a": [10, 11, 12], "b": [12, 11, 10]},
        RetrievalMetricConfig(k_values=(1,)),
    )
    assert round(float(s.per_query["map_at_r"][0]), 4) == 0.5556
    assert round(float(s.per_query["r_precision"][0]), 4) == 0.6667
    assert s.per_query["recall_at_1"][0] == 1.0
    assert round(float(s.per_query["map_at_r"][1]), 4) == 0.3889
    assert s.as_dict().keys() == {"map_at_r", "r_precision", "recall_at_1"}


# ----------------------------------------------------------------------------- random equivalence


@pytest.mark.parametrize("seed", range(6))
def test_rankings_equal_brute_force(seed):
    rng = np.random.default_rng(seed)
    rankings, positives = random_case(rng, 200, np.arange(30) * 7 + 1000, extra=5)
    ap, rp, rec = brute_force_means(rankings, positives)
    s = retrieval_scores(rankings, positives, RetrievalMetricConfig(allow_duplicates=True))
    assert s.map_at_r == pytest.approx(ap, abs=1e-12)
    assert s.r_precision == pytest.approx(rp, abs=1e-12)
    assert s.recall_at_k == pytest.approx(rec, abs=1e-12)
    per = [brute_force(t, g) for t, g in zip(rankings, positives, strict=True)]
    np.testing.assert_allclose(s.per_query["map_at_r"], [p[0] for p in per], atol=1e-12)


def test_duplicates_raise_unless_allowed_then_count_like_the_reference():
    with pytest.raises(RetrievalInputError, match=r"ranking of query 0 repeats id 5 \(positions 0 and 1"):
        retrieval_scores([[5, 5, 7]], [[5, 6, 6]], RetrievalMetricConfig(k_values=(1,)))
    # The case: eccv_caption scores [10, 10, 10] against {10, 11, 12} as mAP@R 1.0.
    with pytest.raises(RetrievalInputError, match="query 'b' repeats id 10"):
        retrieval_scores(
            {"a": [10, 11, 12], "b": [10, 10, 10]},
            {"a": [10], "b": [10, 11, 12]},
            RetrievalMetricConfig(k_values=(1,)),
        )
    # Parity mode, R = 2; t = [5, 5, 7]: rprecision(1) = 1, rprecision(2) = 1/1 (set {5}), so
    # AP = (1 + 1) / 2: a repeat counts once in the denominator but per position in the sum.
    s = retrieval_scores([[5, 5, 7]], [[5, 6, 6]], RetrievalMetricConfig(k_values=(1,), allow_duplicates=True))
    assert s.map_at_r == 1.0 == brute_force([5, 5, 7], [5, 6, 6])[0]
    assert s.r_precision == 1.0
    ranked, gts = {0: [10, 10, 10]}, {0: [10, 11, 12]}
    ref = reference.compute_eccv_metrics(ranked, gts)
    s = retrieval_scores(ranked, gts, RetrievalMetricConfig(k_values=(1,), allow_duplicates=True))
    assert s.map_at_r == ref["eccv_map_at_r"] == 1.0


@pytest.mark.parametrize("seed", range(3))
def test_pmrp_cap_and_metric_selection_equal_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    rankings, positives = random_case(rng, 150, np.arange(80), max_pos=40)
    cfg = RetrievalMetricConfig(
        k_values=(), map_at_r=False, r_precision=True, r_precision_cap=5, allow_duplicates=True
    )
    short = [t[:5] for t in rankings]  # min(R, 5) items suffice
    s = retrieval_scores(short, positives, cfg)
    assert s.map_at_r is None and s.recall_at_k == {}
    assert s.r_precision == pytest.approx(brute_force_means(rankings, positives, (), cap=5)[1])


def test_input_forms_agree_dict_list_array_tensor():
    rng = np.random.default_rng(7)
    rankings, positives = random_case(rng, 50, np.arange(40))
    width = min(len(t) for t in rankings)
    table = np.array([t[:width] for t in rankings])
    cfg = RetrievalMetricConfig(k_values=(1, 3), allow_duplicates=True)
    depth_ok = [i for i, p in enumerate(positives) if len(set(p)) <= width]
    table = table[depth_ok]
    pos = [positives[i] for i in depth_ok]
    as_list = retrieval_scores(table.tolist(), pos, cfg).as_dict()
    keys = [f"q{i}" for i in range(len(pos))]
    as_dict = retrieval_scores(
        {**dict(zip(keys, table.tolist(), strict=True)), "extra": [1]}, dict(zip(keys, pos, strict=True)), cfg
    ).as_dict()
    assert as_list == as_dict
    assert retrieval_scores(table, pos, cfg).as_dict() == as_list
    assert retrieval_scores(torch.from_numpy(table), pos, cfg).as_dict() == as_list


@pytest.mark.parametrize("seed", range(5))
def test_reference_functions_agree_on_random_rankings(seed):
    """Parity with eccv_caption's own per-metric functions (duplicates included)."""
    rng = np.random.default_rng(200 + seed)
    rankings, positives = random_case(rng, 120, np.arange(25), max_pos=8, extra=4)
    ranked = dict(enumerate(rankings))
    gts = dict(enumerate(positives))
    ours = retrieval_scores(ranked, gts, RetrievalMetricConfig(k_values=(1, 5, 10), allow_duplicates=True))
    ref = reference.compute_eccv_metrics(ranked, gts)
    assert ours.map_at_r == pytest.approx(ref["eccv_map_at_r"], abs=1e-9)
    assert ours.r_precision == pytest.approx(ref["eccv_rprecision"], abs=1e-9)
    assert ours.recall_at_k[1] == pytest.approx(ref["eccv_r1"], abs=1e-9)
    for k in (1, 5, 10):
        assert ours.recall_at_k[k] == pytest.approx(reference.compute_r_at_k(ranked, gts, K=k), abs=1e-9)
    assert ours.r_precision == pytest.approx(reference.compute_rprecision(ranked, gts), abs=1e-9)


# ----------------------------------------------------------------------------- similarity matrices


def stable_rankings(similarity, gallery_ids):
    return [list(gallery_ids[np.argsort(-row, kind="stable")]) for row in similarity]


@pytest.mark.parametrize("seed", range(6))
def test_similarity_with_ties_equals_brute_force_on_the_stable_ranking(seed):
    rng = np.random.default_rng(300 + seed)
    n_q, n_g = int(rng.integers(5, 60)), int(rng.integers(12, 80))
    # Few distinct integer scores: many ties, including across the top-k boundary.
    sim = rng.integers(0, 4, size=(n_q, n_g)).astype(np.float32 if seed % 2 else np.float64)
    gallery_ids = rng.permutation(10_000)[:n_g] + 5
    positives = [rng.choice(gallery_ids, size=int(rng.integers(1, 8))).tolist() for _ in range(n_q)]
    ks = (1, 5, 10, n_g + 3)  # K above the gallery size is allowed for a full matrix
    s = retrieval_scores_from_similarity(
        sim, positives, gallery_ids=gallery_ids, config=RetrievalMetricConfig(k_values=ks)
    )
    ap, rp, rec = brute_force_means(stable_rankings(sim, gallery_ids), positives, ks)
    assert s.map_at_r == pytest.approx(ap, abs=1e-12)
    assert s.r_precision == pytest.approx(rp, abs=1e-12)
    assert s.recall_at_k == pytest.approx(rec, abs=1e-12)


def test_similarity_with_dict_positives_selects_and_orders_queries():
    rng = np.random.default_rng(11)
    sim = torch.randn(30, 50, dtype=torch.float64)
    query_ids, gallery_ids = np.arange(30) * 3, np.arange(50) + 1000
    gts = {int(q): rng.choice(gallery_ids, size=3).tolist() for q in query_ids[::-2]}
    s = retrieval_scores_from_similarity(sim, gts, query_ids=query_ids, gallery_ids=gallery_ids)
    rows = [int(q) // 3 for q in gts]
    expected = brute_force_means(stable_rankings(sim.numpy()[rows], gallery_ids), list(gts.values()))
    assert s.map_at_r == pytest.approx(expected[0]) and s.recall_at_k == pytest.approx(expected[2])
    assert s.query_ids.tolist() == list(gts)


@pytest.mark.parametrize("with_torch", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_stable_topk_equals_a_stable_argsort(seed, with_torch, monkeypatch):
    # The metric Spaces run without torch: numpy's partial selection must give the same answer.
    monkeypatch.setattr(topk_module, "_HAVE_TORCH", with_torch)
    rng = np.random.default_rng(400 + seed)
    sim = rng.integers(-2, 3, size=(37, 61)).astype(np.float32)
    sim[3] = 0.0
    sim[4, ::2] = -0.0  # -0.0 == 0.0: a tie, not an order
    sim[5, 7] = np.inf
    scores = as_score_matrix(sim)
    for k in (1, 7, 61, 90):
        expected = np.argsort(-sim, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(stable_topk(scores, k, chunk_rows=5), expected)
        expected_t = np.argsort(-sim.T, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(stable_topk(scores.T, k, chunk_rows=8), expected_t)
        rows = rng.permutation(61)[:9]
        np.testing.assert_array_equal(stable_topk(scores.T, k, rows=rows), expected_t[rows])


def test_topk_entry_point_and_ranking_depth():
    rng = np.random.default_rng(12)
    sim = rng.standard_normal((20, 40))
    gts = {i: rng.choice(40, size=int(rng.integers(1, 6)), replace=False).tolist() for i in range(20)}
    cfg = RetrievalMetricConfig(k_values=(1, 5))
    depth = ranking_depth(gts, cfg)
    assert depth == max(5, max(len(p) for p in gts.values()))
    top = stable_topk(as_score_matrix(sim), depth)
    assert (
        retrieval_scores_from_topk(top, np.arange(20), gts, cfg).as_dict()
        == retrieval_scores_from_similarity(sim, gts, config=cfg).as_dict()
    )


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: retrieval_scores([[1, 2]], [[1, 2, 3]], RetrievalMetricConfig(k_values=(1,))),
            "query 0 has 2 items but 3 are needed",
        ),
        (lambda: retrieval_scores([[]], [[1]], RetrievalMetricConfig(k_values=(1,))), "has 0 items but 1 are needed"),
        (lambda: retrieval_scores([[1, 2]], [[]]), "query 0 has no positives"),
        (lambda: retrieval_scores({"a": [1]}, {"a": [1], "b": [2]}), "no ranking for query 'b'"),
        (lambda: retrieval_scores([[1], [2]], [[1]]), "2 rankings but 1 positive lists"),
        (lambda: retrieval_scores([["x", "y"]], [[1]], RetrievalMetricConfig(k_values=(1,))), "integer ids"),
        (lambda: retrieval_scores([[1]], [[1]], RetrievalMetricConfig(k_values=(0,))), "positive integers"),
        (
            lambda: retrieval_scores_from_similarity(np.zeros((2, 3)), [[0], [1]], gallery_ids=[5, 6]),
            r"shape \(2, 3\) but there are 2 query_ids and 2 gallery_ids",
        ),
        (
            lambda: retrieval_scores_from_similarity(np.zeros((2, 3)), [[0], [9]]),
            "positive id 9 of query 1 is not among the gallery_ids",
        ),
        (
            lambda: retrieval_scores_from_similarity(np.zeros((2, 3)), {7: [0]}),
            "query id 7 is not among the query_ids",
        ),
        (lambda: retrieval_scores_from_similarity(np.array([[0.0, np.nan]]), [[0]]), "NaN"),
        (
            lambda: retrieval_scores_from_similarity(np.zeros((1, 2)), [[0]], gallery_ids=[3, 3]),
            "gallery_ids has duplicates",
        ),
        (lambda: retrieval_scores_from_similarity(np.zeros(3), [[0]]), "must be 2-D"),
        (lambda: retrieval_scores_from_similarity(np.zeros((2, 3)), [[0]]), "2 rows but positives has 1"),
    ],
)
def test_bad_input_raises_a_clear_value_error(call, message):
    # A plain ValueError: the metric Space must not depend on the project's error classes.
    with pytest.raises(RetrievalInputError, match=message) as info:
        call()
    assert isinstance(info.value, ValueError)


# ----------------------------------------------------------------------------- the ECCV Caption suite

ALL_BUT_PMRP = ("coco_1k_recalls", "coco_5k_recalls", "cxc_recalls", "eccv_map_at_r", "eccv_rprecision", "eccv_r1")


@pytest.fixture(scope="module")
def annotations():
    from counterfactory_metrics.map_at_r.eccv_suite import EccvAnnotations

    return EccvAnnotations.load()


@pytest.fixture(scope="module")
def reference_metrics():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        from eccv_caption import Metrics

        return Metrics()


def fold_of(annotations):
    """COCO id -> COCO 1K fold, computed from coco_test_ids.npy directly."""
    caption_fold = {int(c): i // 5000 for i, c in enumerate(annotations.coco_test_ids)}
    image_fold = {int(annotations.coco.t2i[c][0]): f for c, f in caption_fold.items()}
    return caption_fold, image_fold


def random_eccv_rankings(annotations, seed, length=60):
    """Rankings over the real test ids: about half of each query's positives, 12 items of its
    COCO 1K fold (so every fold-filtered ranking has >= 10), random items, duplicates allowed."""
    rng = np.random.default_rng(seed)
    caption_fold, image_fold = fold_of(annotations)
    galleries = {"i2t": np.array(list(caption_fold)), "t2i": np.array(list(image_fold))}
    folds = {
        m: [g[np.array([(caption_fold if m == "i2t" else image_fold)[int(x)] == f for x in g])] for f in range(5)]
        for m, g in galleries.items()
    }
    out = {}
    for m, own_fold in (("i2t", image_fold), ("t2i", caption_fold)):
        rankings = {}
        for q, f in own_fold.items():
            pos = set()
            for source in (annotations.eccv, annotations.coco, annotations.cxc):
                pos.update(int(p) for p in getattr(source, m).get(q, ()))
            # (Two ECCV positives are no test captions: no model can retrieve them.)
            pos = [p for p in pos if rng.random() < 0.5 and p in (caption_fold if m == "i2t" else image_fold)]
            items = pos + rng.choice(folds[m][f], 12).tolist()
            items += rng.choice(galleries[m], length - len(items)).tolist()
            rng.shuffle(items)
            rankings[q] = items
        out[m] = rankings
    return out["i2t"], out["t2i"]


def assert_same(ours, ref, keys):
    for key in keys:
        for m in ("i2t", "t2i"):
            assert ours[key][m] == pytest.approx(float(ref[key][m]), abs=1e-9), (key, m)


@pytest.mark.slow
def test_suite_equals_eccv_caption_on_random_rankings(annotations, reference_metrics):
    from counterfactory_metrics.map_at_r.eccv_suite import EccvSuiteConfig, eccv_suite

    i2t, t2i = random_eccv_rankings(annotations, seed=0)
    ours = eccv_suite(i2t, t2i, EccvSuiteConfig(ALL_BUT_PMRP + ("eccv_recalls",), allow_duplicates=True), annotations)
    ref = reference_metrics.compute_all_metrics(i2t, t2i, target_metrics=ALL_BUT_PMRP, Ks=(1, 5, 10), verbose=False)
    assert set(ref) < set(ours)
    assert_same(ours, ref, ref)
    assert 0.01 < ours["eccv_map_at_r"]["i2t"] < 0.9 and 0.1 < ours["coco_1k_r5"]["t2i"] < 1.0
    # 0.1.0 drops eccv_recalls when eccv_map_at_r is asked for; its intended value:
    for k in (5, 10):
        assert_same(
            ours, {f"eccv_r{k}": reference_metrics.eccv_recalls({"i2t": i2t, "t2i": t2i}, "all", K=k)}, [f"eccv_r{k}"]
        )
    # 0.1.0 returns nothing for eccv_rprecision alone (a key typo); ours returns it.
    alone = eccv_suite(i2t, t2i, EccvSuiteConfig(("eccv_rprecision",), allow_duplicates=True), annotations)
    assert alone == {"eccv_rprecision": ours["eccv_rprecision"]}


@pytest.mark.slow
def test_pmrp_equals_eccv_caption_on_top50_rankings(annotations, tmp_path):
    import json

    from counterfactory_metrics.map_at_r.eccv_suite import EccvSuiteConfig, eccv_suite
    from loading_scripts.eccv import pm_positives

    rng = np.random.default_rng(3)
    images = list(annotations.coco.i2t)
    # 3% of the images share one class (R > 50: the cap matters), the rest random class sets.
    classes = {i: [1] if rng.random() < 0.03 else rng.choice(np.arange(2, 30), 3).tolist() for i in images}
    pm = pm_positives(classes, annotations.coco.i2t)
    for name, mapping in (("image_to_caption", pm.i2t), ("caption_to_image", pm.t2i)):
        (tmp_path / f"pm_{name}.json").write_text(json.dumps({str(k): v.tolist() for k, v in mapping.items()}))
    i2t, t2i = random_eccv_rankings(annotations, seed=1, length=50)
    for m, rankings in (("i2t", i2t), ("t2i", t2i)):  # put some PM positives near the top
        for q, ranking in rankings.items():
            extra = getattr(pm, m).get(q, ())
            ranking[: min(3, len(extra))] = [int(x) for x in extra[:3]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        from eccv_caption import Metrics

        ref = Metrics(extra_file_dir=str(tmp_path)).pmrp({"i2t": i2t, "t2i": t2i}, "all")
    ours = eccv_suite(i2t, t2i, EccvSuiteConfig(("pmrp",), allow_duplicates=True), replace(annotations, pm=pm))
    assert ours.keys() == {"pmrp"}
    assert_same(ours, {"pmrp": ref}, ["pmrp"])
    assert 0.01 < ours["pmrp"]["i2t"] < 0.9


@pytest.mark.slow
def test_suite_from_a_tied_similarity_matrix(annotations, reference_metrics):
    from counterfactory_metrics.map_at_r.eccv_suite import EccvSuiteConfig, eccv_suite, eccv_suite_from_similarity

    rng = np.random.default_rng(4)
    image_ids = rng.permutation(np.array(list(annotations.coco.i2t)))
    caption_ids = rng.permutation(annotations.coco_test_ids)
    col = {int(c): j for j, c in enumerate(caption_ids)}
    # 200 score levels: many ties, also between positives and negatives.
    sim = rng.integers(0, 200, size=(len(image_ids), len(caption_ids)), dtype=np.int16)
    for i, image in enumerate(image_ids):
        for c in annotations.coco.i2t[int(image)]:
            sim[i, col[int(c)]] = 198 + rng.integers(0, 4)  # 198, 199 tie with negatives
    sim = sim.astype(np.float32)
    cfg = EccvSuiteConfig(ALL_BUT_PMRP)
    ours = eccv_suite_from_similarity(sim, image_ids, caption_ids, cfg, annotations)
    scores = as_score_matrix(sim)
    i2t = {int(q): caption_ids[r].tolist() for q, r in zip(image_ids, stable_topk(scores, 200), strict=True)}
    t2i = {int(q): image_ids[r].tolist() for q, r in zip(caption_ids, stable_topk(scores.T, 200), strict=True)}
    whole = tuple(m for m in ALL_BUT_PMRP if not m.startswith("coco_1k"))
    ref = reference_metrics.compute_all_metrics(i2t, t2i, target_metrics=whole, verbose=False)
    assert_same(ours, ref, ref)
    # COCO 1K: the fold-filtered top-200 lists hold >= 10 fold items, so they are exact.
    ranked = eccv_suite(i2t, t2i, EccvSuiteConfig(("coco_1k_recalls",)), annotations)
    assert_same(ours, ranked, ranked)
    assert 0.05 < ours["coco_5k_r1"]["i2t"] < 0.99


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s, a: s.EccvSuiteConfig(("eccv_map",)), r"unknown target metric\(s\) \['eccv_map'\]"),
        (lambda s, a: s.eccv_suite({}, {}, s.EccvSuiteConfig(("pmrp",)), a), "pmrp needs plausible"),
        (
            lambda s, a: s.eccv_suite(
                {i: [int(a.coco_test_ids[0])] for i in a.eccv.i2t},
                {c: [int(c)] for c in a.eccv.t2i},
                s.EccvSuiteConfig(("eccv_r1",)),
                a,
            ),
            "t2i rankings contain .* not COCO 5K test image ids",
        ),
        (
            lambda s, a: s.eccv_suite(
                {i: [int(a.coco_test_ids[0])] * 60 for i in a.coco.i2t},
                {c: [int(a.coco.t2i[c][0])] * 60 for c in a.coco.t2i},
                s.EccvSuiteConfig(("coco_1k_recalls",), allow_duplicates=True),
                a,
            ),
            r"coco_1k \(i2t\): fold 2, after keeping only the fold's items: the ranking of query "
            r"\d+ has 0 items but 10",
        ),
        (
            lambda s, a: s.eccv_suite_from_similarity(np.zeros((2, 2)), [1, 2], [3, 4], None, a),
            "image_ids must be the 5000 distinct COCO 5K test image ids",
        ),
    ],
)
def test_suite_bad_input_raises(annotations, call, message):
    from counterfactory_metrics.map_at_r import eccv_suite as retrieval_eccv

    with pytest.raises(RetrievalInputError, match=message):
        call(retrieval_eccv, annotations)
