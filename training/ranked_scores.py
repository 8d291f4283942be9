"""The score matrices of a two-stage retrieval (training/rerank.py) as the ranking code reads them.

A cross-encoder's evaluation arrays (its cache entry) hold, per retrieval set, the first stage's
normalised embeddings (`first_<query>`, `first_<gallery>`: the model's own ITC head, or the
first-stage model's) and, per direction, each query's top-k candidates (`rr_<dir>_idx`, gallery
columns) with their re-ranked scores (`rr_<dir>_score`). `two_stage_matrix` turns them into the
one queries x gallery matrix the CLIP path's ranking reads (retrieval R@K, the ECCV suite,
ODmAP): the re-ranked candidates first, by their re-ranked score, every other item after them in
the first stage's order, so R@K for K <= k is BLIP's own ranking (`train_retrieval.py`
`evaluation` fills the rest with -100) and a deeper metric still sees a whole ranking.

It also holds the dual encoders' one matrix (`tied_scores`: equal inputs tie exactly) and
`direction_scores`, each direction's matrix of either kind. Imports only numpy:
training/evaluation.py, training/rerank.py and training/unit_scores.py all read it.
"""

from __future__ import annotations

import numpy as np

#: set -> (query embeddings, gallery embeddings, direction names): the coco retrieval set ranks
#: captions for each image (i2t) and images for each caption (t2i); the decorrelation queries
#: rank the gallery captions (q2t, ODmAP).
SETS = {
    "retrieval": ("image", "text", ("i2t", "t2i")),
    "odmap": ("query_image", "gallery_text", ("q2t",)),
}


def first(name: str) -> str:
    """The key of a first-stage embedding array (`first_image`, ...)."""
    return f"first_{name}"


def has_two_stage(emb: dict, which: str) -> bool:
    """Whether `emb` holds a two-stage ranking of set `which` (SETS)."""
    return f"rr_{SETS[which][2][0]}_idx" in emb


def two_stage_matrix(emb: dict, direction: str) -> np.ndarray:
    """(queries, gallery) scores of `direction` (i2t, t2i, q2t): re-ranked candidates above all
    others, each part in its own order (see the module docstring). float64: the shift below the
    candidates never rounds two first-stage scores into a tie."""
    query, gallery = _sides(direction)
    sim = emb[first(query)].astype(np.float64) @ emb[first(gallery)].astype(np.float64).T
    idx, score = emb[f"rr_{direction}_idx"].astype(np.int64), emb[f"rr_{direction}_score"].astype(np.float64)
    if idx.shape[1] == 0:
        return sim
    rows = np.arange(len(sim))[:, None]
    inside = np.zeros(sim.shape, dtype=bool)
    inside[rows, idx] = True
    outside_max = np.where(inside, -np.inf, sim).max(axis=1, initial=-np.inf)
    # Each row's others shifted to end 1 below its lowest re-ranked score: their order is kept.
    shift = np.where(np.isfinite(outside_max), outside_max - score.min(axis=1) + 1.0, 0.0)
    out = sim - shift[:, None]
    out[rows, idx] = score
    return out


def _sides(direction: str) -> tuple[str, str]:
    """(query, gallery) embedding names of a direction."""
    image, text = SETS["retrieval"][:2]
    return {
        "i2t": (image, text),
        "t2i": (text, image),
        "q2t": SETS["odmap"][:2],
    }[direction]


def ranked_shapes(data, k: int, width: int) -> dict[str, tuple[int, ...]]:
    """Array name -> shape of the two-stage arrays training/rerank.py's `Ranker` gives for `data`
    (an EvalData) with `k` candidates a query and first-stage embeddings `width` wide."""
    out: dict[str, tuple[int, ...]] = {}
    sides = {
        "retrieval": (None if data.retrieval is None else len(data.retrieval), len(data.captions)),
        "odmap": (None if data.queries is None else len(data.queries), len(data.gallery_captions)),
    }
    for which, (queries, gallery) in sides.items():
        if queries is None:
            continue
        query, text, directions = SETS[which]
        out.update({first(query): (queries, width), first(text): (gallery, width)})
        for direction in directions:
            rows, cols = (gallery, queries) if direction == "t2i" else (queries, gallery)
            out.update({f"rr_{direction}_{part}": (rows, min(k, cols)) for part in ("idx", "score")})
    return out


def _copy_equal(matrix: np.ndarray, keys: np.ndarray) -> None:
    """Overwrite, in place, each row of `matrix` whose key an earlier row has with that row."""
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    source = first[inverse.ravel()]
    repeated = np.flatnonzero(source != np.arange(len(source)))
    if len(repeated):
        matrix[repeated] = matrix[source[repeated]]


def _row_keys(x: np.ndarray) -> np.ndarray:
    """Each row of `x` as one opaque value: equal rows, equal values."""
    x = np.ascontiguousarray(x)
    return x.view(np.dtype((np.void, x.dtype.itemsize * x.shape[1]))).ravel()


def tied_scores(images: np.ndarray, texts: np.ndarray, captions: list[str]) -> np.ndarray:
    """`images @ texts.T` with each repeated caption's column (by text, or by embedding when
    `captions` does not name them) a copy of its first one's, and each repeated image
    embedding's row likewise: equal inputs tie exactly. The product alone would not tie them:
    BLAS sums each cell in an order that depends on its position, which puts equal captions up
    to ~200 ulp apart and lets that noise break their tie (#44). In place: no second matrix."""
    scores = images @ texts.T
    _copy_equal(scores.T, np.asarray(captions) if len(captions) == len(texts) else _row_keys(texts))
    _copy_equal(scores, _row_keys(images))
    return scores


def direction_scores(emb, img_order: np.ndarray, cap_order: np.ndarray, captions: list[str]) -> tuple:
    """(images x captions) scores ranking each direction, rows and columns in the given orders: one
    matrix of a dual encoder's, or each direction's own of a two-stage retrieval
    (training/rerank.py)."""
    if has_two_stage(emb, "retrieval"):
        i2t = two_stage_matrix(emb, "i2t")[np.ix_(img_order, cap_order)]
        return i2t, two_stage_matrix(emb, "t2i")[np.ix_(cap_order, img_order)].T
    sim = tied_scores(emb["image"][img_order], emb["text"][cap_order], captions)
    return sim, sim
