"""ODmAP@k (builders/decorrelation/METHOD.md §5): worked examples, brute-force equivalence, streaming top-k, bad inputs."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import scipy.sparse
import torch

import counterfactory_metrics.odmap.odmap_scores as odmap_module
from counterfactory_metrics.odmap.odmap_scores import (
    average_precision_at_k,
    gallery_mentions,
    odmap,
    odmap_from_topk,
)
from counterfactory_metrics.map_at_r.topk import topk_from_embeddings
from counterfactory_metrics.odmap.class_match import COCO_CLASSES, COCO_TABLE
from counterfactory_metrics.odmap.noun_phrases import NounPhraseCache, chunk_captions

from helpers.reference_odmap import (
    VOCAB_TAGS,
    DictTagger,
    random_caption,
    reference_ap_at_k,
    reference_odmap_from_captions,
    reference_odmap_from_rankings,
    reference_topk,
)


def _random_case(
    rng: np.random.Generator, *, num_queries: int, gallery: int, classes: int, length: int, duplicates: bool
):
    mentions = rng.random((gallery, classes)) < rng.uniform(0.05, 0.5)
    removed = np.zeros((num_queries, classes), dtype=bool)
    present = np.zeros((num_queries, classes), dtype=bool)
    for q in range(num_queries):
        perm = rng.permutation(classes)
        n_removed = int(rng.integers(1, max(2, classes // 3)))
        n_present = int(rng.integers(1, classes - n_removed + 1))
        removed[q, perm[:n_removed]] = True
        present[q, perm[n_removed : n_removed + n_present]] = True
    if duplicates:
        topk = rng.integers(gallery, size=(num_queries, length))
    else:
        topk = np.stack([rng.permutation(gallery)[:length] for _ in range(num_queries)])
    return topk, mentions, removed, present


def _sets(matrix: np.ndarray) -> list[set[int]]:
    return [set(np.flatnonzero(row).tolist()) for row in matrix]


def test_docstring_examples():
    result = doctest.testmod(odmap_module, raise_on_error=False)
    assert result.attempted >= 4 and result.failed == 0


# --------------------------------------------------------------------------- worked examples


def test_ap_at_k_hand_computed():
    rel = np.array([[1, 0, 1, 0, 1]], dtype=bool)
    ap = average_precision_at_k(rel, (1, 3, 5))
    # P(1) = 1, P(3) = 2/3, P(5) = 3/5: AP@3 = (1 + 2/3) / 3, AP@5 = (1 + 2/3 + 3/5) / 5
    assert ap[1][0] == pytest.approx(1.0)
    assert ap[3][0] == pytest.approx((1 + 2 / 3) / 3)
    assert ap[5][0] == pytest.approx((1 + 2 / 3 + 3 / 5) / 5)
    assert ap[5][0] == pytest.approx(0.4533333333)
    only_fifth = average_precision_at_k(np.array([[0, 0, 0, 0, 1]], dtype=bool), (5,))[5][0]
    assert only_fifth == pytest.approx(1 / 25)
    all_right = average_precision_at_k(np.ones((1, 10), dtype=bool), (10,))[10][0]
    assert all_right == pytest.approx(1.0)


def test_top1_correct_gives_odmap1_of_one():
    # gallery: 0 mentions dog only (correct), 1 mentions person + dog (removed class), 2 nothing
    mentions = np.array([[False, True], [True, True], [False, False]])
    removed = np.array([[True, False]] * 3)
    present = np.array([[False, True]] * 3)
    topk = np.array([[0, 1, 2], [0, 2, 1], [0, 0, 0]])
    res = odmap_from_topk(topk, mentions, removed, present, k_values=(1, 2, 3))
    assert res.scores[1] == 1.0
    assert res.per_query[2].tolist() == pytest.approx([0.5, 0.5, 1.0])
    assert res.per_query[3].tolist() == pytest.approx([1 / 3, 1 / 3, 1.0])
    assert res.as_dict() == {"ODmAP@1": 1.0, "ODmAP@2": pytest.approx(2 / 3), "ODmAP@3": pytest.approx(5 / 9)}
    wrong_first = odmap_from_topk(np.array([[1, 0]]), mentions, removed[:1], present[:1], k_values=(1, 2))
    assert wrong_first.scores == {1: 0.0, 2: pytest.approx(0.25)}


def test_require_present_all_vs_any():
    # classes: 0 removed; 1 and 2 present. caption 0 mentions 1 only, caption 1 mentions 1 and 2
    mentions = np.array([[False, True, False], [False, True, True]])
    removed = np.array([[True, False, False]])
    present = np.array([[False, True, True]])
    topk = np.array([[0, 1]])
    assert odmap_from_topk(topk, mentions, removed, present, k_values=(1,)).scores[1] == 1.0
    res_all = odmap_from_topk(topk, mentions, removed, present, k_values=(1, 2), require_present="all")
    assert res_all.scores == {1: 0.0, 2: pytest.approx(0.25)}


# --------------------------------------------------------------------------- random equivalence


@pytest.mark.parametrize("seed", range(12))
def test_fast_path_matches_brute_force_on_random_data(seed):
    rng = np.random.default_rng(seed)
    num_queries = int(rng.integers(1, 40))
    gallery = int(rng.integers(10, 200))
    classes = int(rng.integers(2, 12))
    length = int(rng.integers(10, 16))
    duplicates = bool(seed % 2)
    topk, mentions, removed, present = _random_case(
        rng, num_queries=num_queries, gallery=gallery, classes=classes, length=length, duplicates=duplicates
    )
    k_values = (1, 5, 10, length)
    for require_present in ("any", "all"):
        expected = reference_odmap_from_rankings(
            topk.tolist(), _sets(mentions), _sets(removed), _sets(present), k_values, require_present
        )
        for chunk_size in (1, 7, 4096):
            got = odmap_from_topk(
                topk,
                mentions,
                removed,
                present,
                k_values=k_values,
                require_present=require_present,
                chunk_size=chunk_size,
            )
            assert got.scores == pytest.approx(expected, abs=1e-12)
        sparse = odmap_from_topk(
            topk,
            scipy.sparse.csr_matrix(mentions),
            removed,
            present,
            k_values=k_values,
            require_present=require_present,
        )
        assert sparse.scores == pytest.approx(expected, abs=1e-12)
        coo = odmap_from_topk(
            torch.from_numpy(topk),
            scipy.sparse.coo_matrix(mentions),
            torch.from_numpy(removed),
            present.astype(np.int8),
            k_values=k_values,
            require_present=require_present,
        )
        assert coo.scores == pytest.approx(expected, abs=1e-12)
    # per-query AP@k equals the term-by-term formula
    got = odmap_from_topk(topk, mentions, removed, present, k_values=(length,))
    ms, rs, ps = _sets(mentions), _sets(removed), _sets(present)
    for q in range(num_queries):
        rel = [int(not (ms[g] & rs[q]) and bool(ms[g] & ps[q])) for g in topk[q]]
        assert got.per_query[length][q] == pytest.approx(reference_ap_at_k(rel, length))


def test_duplicates_in_a_ranking_count_at_every_position():
    mentions = np.array([[False, True], [True, False]])
    removed, present = np.array([[True, False]]), np.array([[False, True]])
    res = odmap_from_topk(np.array([[0, 0, 1, 0]]), mentions, removed, present, k_values=(4,))
    # rel = 1 1 0 1 -> (1 + 1 + 0 + 3/4) / 4
    assert res.scores[4] == pytest.approx((1 + 1 + 0.75) / 4)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.slow
def test_streaming_topk_matches_full_matrix_with_ties(seed):
    rng = np.random.default_rng(100 + seed)
    num_queries, gallery, dim = int(rng.integers(1, 60)), int(rng.integers(12, 500)), 4
    # small integers: many exact ties, and exact float32 arithmetic in numpy and torch alike
    query = rng.integers(-2, 3, (num_queries, dim)).astype(np.float32)
    gal = rng.integers(-2, 3, (gallery, dim)).astype(np.float32)
    gal[rng.integers(gallery, size=gallery // 3)] = gal[0]  # duplicate gallery rows
    k = int(rng.integers(1, min(gallery, 12) + 1))
    expected = reference_topk(query, gal, k)
    scores_full = query @ gal.T
    for chunk_size, query_chunk_size in ((1, 1), (k, 3), (k + 1, 5), (37, 1000), (10_000, 7)):
        idx, scores = topk_from_embeddings(query, gal, k, chunk_size=chunk_size, query_chunk_size=query_chunk_size)
        np.testing.assert_array_equal(idx, expected)
        np.testing.assert_array_equal(scores, np.take_along_axis(scores_full, expected, 1))


@pytest.mark.parametrize("with_torch", [True, False])
def test_streaming_topk_random_floats_and_normalize(with_torch, monkeypatch):
    import counterfactory_metrics.map_at_r.topk as topk_module

    monkeypatch.setattr(topk_module, "_HAVE_TORCH", with_torch)
    rng = np.random.default_rng(7)
    # dyadic values keep float32 dot products exact, so the order is fully determined
    query = (rng.integers(-64, 65, (30, 16)) / 64).astype(np.float32)
    gal = (rng.integers(-64, 65, (1000, 16)) / 64).astype(np.float32)
    idx, _ = topk_from_embeddings(torch.from_numpy(query), gal, 10, chunk_size=128)
    np.testing.assert_array_equal(idx, reference_topk(query, gal, 10))
    idx_cos, _ = topk_from_embeddings(query, gal, 5, normalize=True, chunk_size=100)
    qn = query / np.linalg.norm(query, axis=1, keepdims=True)
    gn = gal / np.linalg.norm(gal, axis=1, keepdims=True)
    ref = np.argsort(-(qn @ gn.T), axis=1, kind="stable")[:, :5]
    assert (idx_cos == ref).mean() > 0.99  # float rounding may swap near-equal cosines


def test_embeddings_to_odmap_pipeline_matches_brute_force():
    rng = np.random.default_rng(3)
    query = rng.integers(-3, 4, (25, 8)).astype(np.float32)
    gal = rng.integers(-3, 4, (300, 8)).astype(np.float32)
    _, mentions, removed, present = _random_case(
        rng, num_queries=25, gallery=300, classes=6, length=10, duplicates=False
    )
    topk, _ = topk_from_embeddings(query, gal, 10, chunk_size=64, query_chunk_size=8)
    got = odmap_from_topk(topk, mentions, removed, present)
    expected = reference_odmap_from_rankings(
        reference_topk(query, gal, 10).tolist(), _sets(mentions), _sets(removed), _sets(present), (1, 5, 10)
    )
    assert got.scores == pytest.approx(expected, abs=1e-12)


# --------------------------------------------------------------------------- text path


@pytest.mark.slow
def test_text_path_matches_brute_force_with_a_fixed_tagger():
    rng = np.random.default_rng(11)
    tagger = DictTagger(VOCAB_TAGS)
    pool = [random_caption(rng) for _ in range(60)]
    queries = 30
    retrieved = [[pool[i] for i in rng.integers(len(pool), size=10)] for _ in range(queries)]
    candidates = ["person", "dog", "cat", "frisbee", "dining table", "teddy bear", "skis", "knife"]
    removed, present = [], []
    for _ in range(queries):
        perm = rng.permutation(len(candidates))
        removed.append([candidates[i] for i in perm[: int(rng.integers(1, 3))]])
        present.append([candidates[i] for i in perm[3 : 3 + int(rng.integers(1, 4))]])

    def nps(caption: str):
        return chunk_captions([caption], tagger)[0].noun_phrases

    for require_present in ("any", "all"):
        expected = reference_odmap_from_captions(
            retrieved, removed, present, (1, 5, 10), require_present, COCO_TABLE, nps
        )
        got = odmap(retrieved, removed, present, require_present=require_present, cache=NounPhraseCache(tagger))
        assert got.scores == pytest.approx(expected, abs=1e-12)
        assert 0 < got.scores[10] < 1


def test_gallery_mentions_chunks_each_unique_caption_once():
    tagger = DictTagger(VOCAB_TAGS)
    cache = NounPhraseCache(tagger)
    captions = ["A dog on the grass", "A man with a frisbee", "A dog on the grass", "Two cats"] * 3
    m = gallery_mentions(captions, ["dog", "person", "frisbee", "cat"], cache=cache)
    assert tagger.calls == 3
    assert m.shape == (12, 4) and m.dtype == bool
    assert m[:4].tolist() == [
        [True, False, False, False],
        [False, True, True, False],
        [True, False, False, False],
        [False, False, False, True],
    ]
    assert (m[4:8] == m[:4]).all()
    again = gallery_mentions(captions, COCO_CLASSES, cache=cache, batch_size=2)
    assert tagger.calls == 3 and again.shape == (12, 80)


def test_text_path_with_a_user_table():
    cache = NounPhraseCache(DictTagger({**VOCAB_TAGS, "hurdle": "NN", "horse": "NN"}))
    table = {"horse": ["pony"], "hurdle": ["fence"], "rider": ["man", "woman"]}
    res = odmap(
        [["A horse near a hurdle", "A man on a horse"]],
        [["rider"]],
        [["horse"]],
        k_values=(1, 2),
        table=table,
        cache=cache,
    )
    assert res.scores == {1: 1.0, 2: 0.5}


def test_text_path_with_the_nltk_tagger(nltk_data_dir):
    retrieved = [["A dog on the grass.", "A man with a dog."], ["A man with a dog.", "A dog on the grass."]]
    res = odmap(retrieved, [["person"], ["person"]], [["dog"], ["dog"]], k_values=(1, 2))
    assert res.scores == {1: 0.5, 2: pytest.approx(0.375)}


# --------------------------------------------------------------------------- bad inputs


def _ok_inputs():
    mentions = np.array([[False, True], [True, False], [True, True]])
    return np.array([[0, 1, 2]]), mentions, np.array([[True, False]]), np.array([[False, True]])


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: {**a, "topk_indices": a["topk_indices"][:, :2]}, "k=3 exceeds the ranking length 2"),
        (lambda a: {**a, "topk_indices": np.zeros((0, 3), dtype=int)}, "no queries"),
        (lambda a: {**a, "topk_indices": np.array([[0, 1, 3]])}, "gallery index 3"),
        (lambda a: {**a, "topk_indices": np.array([[0, -1, 2]])}, "gallery index -1"),
        (lambda a: {**a, "topk_indices": np.array([[0.0, 1.0, 2.0]])}, "integer"),
        (lambda a: {**a, "topk_indices": np.array([0, 1, 2])}, "2-D"),
        (lambda a: {**a, "removed": np.array([[True, False], [True, False]])}, "removed has shape"),
        (lambda a: {**a, "present": np.array([[False, True, False]])}, "present has shape"),
        (lambda a: {**a, "present": np.array([[False, False]])}, "no present classes"),
        (lambda a: {**a, "removed": np.array([[False, False]])}, "no removed classes"),
        (lambda a: {**a, "removed": np.array([[True, True]])}, "both removed and present"),
        (lambda a: {**a, "mention_matrix": a["mention_matrix"].astype(float)}, "boolean"),
        (lambda a: {**a, "mention_matrix": a["mention_matrix"].astype(int) * 2}, "boolean"),
        (lambda a: {**a, "k_values": ()}, "k_values is empty"),
        (lambda a: {**a, "k_values": (0, 1)}, "positive integers"),
        (lambda a: {**a, "require_present": "most"}, "'any' or 'all'"),
    ],
)
def test_fast_path_bad_inputs_raise(change, message):
    topk, mentions, removed, present = _ok_inputs()
    args = dict(
        topk_indices=topk,
        mention_matrix=mentions,
        removed=removed,
        present=present,
        k_values=(1, 3),
        require_present="any",
    )
    args = change(args)
    with pytest.raises(ValueError, match=message):
        odmap_from_topk(
            args.pop("topk_indices"), args.pop("mention_matrix"), args.pop("removed"), args.pop("present"), **args
        )


def test_text_path_bad_inputs_raise():
    cache = NounPhraseCache(DictTagger(VOCAB_TAGS))
    ranking = [["A dog", "A cat"]]
    with pytest.raises(ValueError, match="length mismatch: 1 rankings, 2 removed_classes"):
        odmap(ranking, [["cat"], ["cat"]], [["dog"]], k_values=(1,), cache=cache)
    with pytest.raises(ValueError, match="no queries"):
        odmap([], [], [], cache=cache)
    with pytest.raises(ValueError, match="k=10 exceeds the ranking length 2 of query 0"):
        odmap(ranking, [["cat"]], [["dog"]], cache=cache)
    with pytest.raises(ValueError, match="unicorn"):
        odmap(ranking, [["unicorn"]], [["dog"]], k_values=(1,), cache=cache)
    with pytest.raises(ValueError, match="no present classes"):
        odmap(ranking, [["cat"]], [[]], k_values=(1,), cache=cache)
    with pytest.raises(ValueError, match="got the string"):
        odmap(ranking, ["cat"], [["dog"]], k_values=(1,), cache=cache)
    with pytest.raises(ValueError, match="must be a list of captions"):
        odmap(["A dog"], [["cat"]], [["dog"]], k_values=(1,), cache=cache)
    with pytest.raises(ValueError, match="expected a string"):
        odmap([["A dog", None]], [["cat"]], [["dog"]], k_values=(2,), cache=cache)


def test_topk_bad_inputs_raise():
    q = np.zeros((2, 4), dtype=np.float32)
    g = np.zeros((5, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="k=6 exceeds the gallery size 5"):
        topk_from_embeddings(q, g, 6)
    with pytest.raises(ValueError, match="dims differ"):
        topk_from_embeddings(q, np.zeros((5, 3)), 1)
    with pytest.raises(ValueError, match="no queries"):
        topk_from_embeddings(np.zeros((0, 4)), g, 1)
    with pytest.raises(ValueError, match="positive integer"):
        topk_from_embeddings(q, g, 0)
    bad_g = g.copy()
    bad_g[3, 1] = np.nan
    with pytest.raises(ValueError, match="gallery_emb has NaN"):
        topk_from_embeddings(q, bad_g, 1, chunk_size=2)
    bad_q = q.copy()
    bad_q[1, 0] = np.inf
    with pytest.raises(ValueError, match="query_emb has NaN"):
        topk_from_embeddings(bad_q, g, 1)
