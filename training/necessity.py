"""Object necessity PN per removed class: PN = (s(x, y) - s(x', y)) / s(x, y), x the original
image, x' the object-removal image and y an original caption of x that mentions the removed class
(the model-agnostic reading of the NUIF paper's probability of necessity, (P(m | o_d) -
P(m | o'_d)) / P(m | o_d)). s is a match score in [0, 1]: a dual encoder's cosine mapped to
[0, 1], (cos + 1) / 2 (`cosine_s`, as that paper maps its similarity), or a cross-encoder's ITM
match probability (builders/models/cross_encoders.py, scored by training/rerank.py `necessity_s`
for the report and the trainer alike).
Every model's values, per-class means and units go through this code and training/unit_scores.py."""

from __future__ import annotations

import numpy as np

from training.eval_data import EvalData


def original_rows(query_image_ids: np.ndarray, image_ids: np.ndarray) -> np.ndarray:
    """Row of each query's source image x among the retrieval images (-1: not in that split)."""
    row = {int(i): r for r, i in enumerate(image_ids)}
    return np.asarray([row.get(int(i), -1) for i in query_image_ids], dtype=np.int64)


def necessity_pairs(rows: np.ndarray, data: EvalData) -> list[tuple[int, int, list[str]]]:
    """(query q, gallery caption row t, the classes q removed that t mentions) of every original
    caption of a query that mentions a class it removed, whose x is row
    `rows[q]` of the retrieval split (`original_rows`; -1: skipped)."""
    text_row = {int(c): i for i, c in enumerate(data.gallery_ids)}
    out = []
    for q, removed in enumerate(data.removed):
        if rows[q] < 0:
            continue
        for cap in data.query_captions[q]:
            t = text_row.get(int(cap))
            classes = [] if t is None else sorted(set(removed) & set(data.gallery_mentions[t]))
            if classes:
                out.append((q, t, classes))
    return out


def cosine_s(original_images: np.ndarray, rows: np.ndarray, emb, pairs: list) -> np.ndarray:
    """(pairs, 2): s(x, y) and s(x', y) of each `necessity_pairs` pair for a dual encoder, its
    cosine mapped to [0, 1], (cos + 1) / 2; `original_images`: the retrieval split's images."""
    text = emb["gallery_text"]
    s = [
        ((original_images[rows[q]] @ text[t] + 1) / 2, (emb["query_image"][q] @ text[t] + 1) / 2) for q, t, _ in pairs
    ]
    return np.asarray(s, np.float32).reshape(-1, 2)


def necessity_values(pairs: list, s: np.ndarray) -> list[tuple[int, str, float]]:
    """(query, removed class, PN) of each class of each `necessity_pairs` pair, from its s(x, y)
    and s(x', y) (`s`: `cosine_s`, or a cross-encoder's match probabilities)."""
    return [
        (q, c, float((s_x - s_xp) / s_x))
        for (q, _, classes), (s_x, s_xp) in zip(pairs, s, strict=True)
        for c in classes
    ]


#: The evaluation array of a cross-encoder's s(x, y) and s(x', y) of each `necessity_pairs`
#: pair (pairs x 2), scored by training/rerank.py `necessity_s`, the report's scoring too.
CROSS_S = "necessity_s"


def has_necessity(emb) -> bool:
    """Whether the evaluation's arrays `emb` give PN: a dual encoder's embeddings of the retrieval
    images and the queries, or a cross-encoder's scored s (`CROSS_S`)."""
    return CROSS_S in emb or ("image" in emb and "query_image" in emb)


def own_necessity_values(emb, data: EvalData) -> list[tuple[int, str, float]]:
    """`necessity_values` of a model whose retrieval split holds the queries' x (`has_necessity`):
    a dual encoder's `cosine_s`, or a cross-encoder's scored s."""
    rows = original_rows(data.query_image_ids, data.image_ids)
    pairs = necessity_pairs(rows, data)
    s = emb[CROSS_S] if CROSS_S in emb else cosine_s(emb["image"], rows, emb, pairs)
    return necessity_values(pairs, s)


def necessity(values: list[tuple[int, str, float]]) -> dict[str, float]:
    """PN per removed class and its mean over every value (`necessity_values`)."""
    per_class: dict[str, list[float]] = {}
    for _, c, v in values:
        per_class.setdefault(c, []).append(v)
    out = {f"necessity/PN_{c}": float(np.mean(v)) for c, v in sorted(per_class.items())}
    if values:
        out["necessity/PN_mean"] = float(np.mean([v for _, _, v in values]))
    return out
