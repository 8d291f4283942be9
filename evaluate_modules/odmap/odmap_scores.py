"""ODmAP@k, the object-decorrelation metric (Kim et al., 2023, §3.2).

Queries are object-removal images x' with removed classes R and present classes P. A retrieved
caption y is *correct* iff (1) no noun phrase of y matches a class in R and (2) some noun phrase of
y matches a class in P (`require_present="any"`, the default) or every class in P is matched by
some noun phrase (`require_present="all"`). With rel(i) the correctness of the i-th retrieved
caption::

    P(i)    = (1/i) * sum_{j<=i} rel(j)
    AP@k    = (1/k) * sum_{i<=k} rel(i) * P(i)
    ODmAP@k = mean over queries of AP@k

so ODmAP@1 is the fraction of queries whose top-1 caption is correct. Every ranked position counts
(a caption retrieved twice counts twice).

Two entry points:

- `odmap(retrieved_captions, removed_classes, present_classes)`: rankings as caption texts;
  noun phrases via `noun_phrases` (each unique caption chunked once) and class matching via
  `class_match` (the paper's COCO table by default, or a user table).
- `odmap_from_topk(topk_indices, mention_matrix, removed, present)`: the fast path for a large
  gallery. `mention_matrix[g, c]` says whether gallery caption g mentions class c (precompute it
  once with `gallery_mentions`); `topk_indices` come from any retrieval code, e.g. counterfactory's
  streaming `counterfactory_metrics.map_at_r.topk.topk_from_embeddings`, which never holds the queries x
  gallery matrix (10,000 queries x 600,000 captions would be 24 GB as float32).

Example:
    >>> import numpy as np
    >>> mentions = np.array([[1, 0], [0, 1], [1, 1]], dtype=bool)  # gallery x classes
    >>> removed = np.array([[True, False]])                           # query 0 lost class 0
    >>> present = np.array([[False, True]])                           # ... and still has class 1
    >>> res = odmap_from_topk(np.array([[1, 2]]), mentions, removed, present, k_values=(1, 2))
    >>> res.as_dict()
    {'ODmAP@1': 1.0, 'ODmAP@2': 0.5}
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union

import numpy as np

from .class_match import ClassMatcher, TableLike

if TYPE_CHECKING:  # NLTK is imported only by the text path
    from .noun_phrases import NounPhraseCache

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_K_VALUES",
    "OdmapResult",
    "average_precision_at_k",
    "gallery_mentions",
    "odmap",
    "odmap_from_topk",
    "per_class_odmap",
    "plot_per_class",
    "relevance_from_mentions",
]

DEFAULT_K_VALUES: tuple[int, ...] = (1, 5, 10)
RequirePresent = Literal["any", "all"]


@dataclass(frozen=True)
class OdmapResult:
    """ODmAP@k per k, and AP@k per query (in query order) for confidence intervals / analysis."""

    scores: dict[int, float]
    per_query: dict[int, np.ndarray] = field(repr=False)
    num_queries: int

    def as_dict(self) -> dict[str, float]:
        return {f"ODmAP@{k}": v for k, v in self.scores.items()}


# ----------------------------------------------------------------------------- validation


def _check_k_values(k_values: Iterable[int], ranking_length: int | None = None) -> tuple[int, ...]:
    ks = tuple(k_values)
    if not ks:
        raise ValueError("k_values is empty; pass e.g. (1, 5, 10)")
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k_values must be positive integers, got {k!r}")
    ks = tuple(sorted({int(k) for k in ks}))
    if ranking_length is not None and ks[-1] > ranking_length:
        raise ValueError(
            f"k={ks[-1]} exceeds the ranking length {ranking_length}: retrieve at least "
            f"{ks[-1]} items per query or drop k={ks[-1]} from k_values"
        )
    return ks


def _check_require_present(require_present: str) -> str:
    if require_present not in ("any", "all"):
        raise ValueError(f"require_present must be 'any' or 'all', got {require_present!r}")
    return require_present


def _as_array(x: Any, name: str) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, without importing torch
        x = x.detach().cpu().numpy()
    try:
        return np.asarray(x)
    except ValueError as err:  # ragged nested lists
        raise ValueError(f"{name} must be a rectangular array: {err}") from None


def _as_bool_matrix(x: Any, name: str) -> np.ndarray:
    arr = _as_array(x, name)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {arr.shape}")
    if arr.dtype == bool:
        return arr
    if np.issubdtype(arr.dtype, np.integer) and arr.size and not np.isin(arr, (0, 1)).all():
        raise ValueError(f"{name} must be boolean (or 0/1); it holds other values")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be boolean (or 0/1 integers), got dtype {arr.dtype}")
    return arr.astype(bool)


def _check_query_sets(removed: np.ndarray, present: np.ndarray, require_present: str) -> None:
    no_present = np.flatnonzero(~present.any(axis=1))
    if no_present.size:
        raise ValueError(
            f"{no_present.size} queries have no present classes (empty positives), e.g. query "
            f"{int(no_present[0])}: a retrieved caption could never be correct"
        )
    no_removed = np.flatnonzero(~removed.any(axis=1))
    if no_removed.size:
        raise ValueError(
            f"{no_removed.size} queries have no removed classes, e.g. query {int(no_removed[0])}: "
            "ODmAP queries are object-removal images"
        )
    both = np.flatnonzero((removed & present).any(axis=1))
    if both.size:
        raise ValueError(f"{both.size} queries list a class as both removed and present, e.g. query {int(both[0])}")


# ----------------------------------------------------------------------------- core formulas


def average_precision_at_k(relevance: np.ndarray, k_values: Iterable[int]) -> dict[int, np.ndarray]:
    """AP@k per query from a [Q x n] relevance matrix (Kim et al., 2023, §3.2), for each k."""
    rel = _as_bool_matrix(relevance, "relevance")
    ks = _check_k_values(k_values, rel.shape[1])
    kmax = ks[-1]
    r = rel[:, :kmax].astype(np.float64)
    precision = np.cumsum(r, axis=1) / np.arange(1, kmax + 1)
    running = np.cumsum(r * precision, axis=1)
    return {k: running[:, k - 1] / k for k in ks}


def relevance_from_mentions(
    retrieved_mentions: np.ndarray,
    removed: np.ndarray,
    present: np.ndarray,
    require_present: RequirePresent = "any",
) -> np.ndarray:
    """rel [Q x k] from the mentions [Q x k x C] of the retrieved captions and [Q x C] class sets."""
    _check_require_present(require_present)
    hit_removed = (retrieved_mentions & removed[:, None, :]).any(axis=2)
    if require_present == "any":
        ok_present = (retrieved_mentions & present[:, None, :]).any(axis=2)
    else:
        ok_present = ~((~retrieved_mentions) & present[:, None, :]).any(axis=2)
    return ~hit_removed & ok_present


def _gather_rows(mention_matrix: Any, rows: np.ndarray) -> np.ndarray:
    if hasattr(mention_matrix, "tocsr"):  # scipy.sparse
        return np.asarray(mention_matrix[rows].toarray(), dtype=bool)
    return np.asarray(mention_matrix[rows], dtype=bool)


def odmap_from_topk(
    topk_indices: Any,
    mention_matrix: Any,
    removed: Any,
    present: Any,
    *,
    k_values: Iterable[int] = DEFAULT_K_VALUES,
    require_present: RequirePresent = "any",
    chunk_size: int = 4096,
) -> OdmapResult:
    """ODmAP@k from ranked gallery indices and a precomputed gallery x class mention matrix.

    Args:
        topk_indices: [Q x n] integer gallery indices, best first (n >= max(k_values)).
        mention_matrix: [G x C] bool (numpy, torch or scipy.sparse): caption g mentions class c.
        removed: [Q x C] bool, the removed classes R of each query.
        present: [Q x C] bool, the present classes P of each query.
        k_values: the k of ODmAP@k.
        require_present: "any" (default) or "all" present classes must be mentioned.
        chunk_size: queries processed at a time (bounds the [chunk x k x C] gather).
    """
    _check_require_present(require_present)
    topk = _as_array(topk_indices, "topk_indices")
    if topk.ndim != 2:
        raise ValueError(f"topk_indices must be 2-D [queries x k], got shape {topk.shape}")
    if topk.size and not np.issubdtype(topk.dtype, np.integer):
        raise ValueError(f"topk_indices must hold integer gallery indices, got dtype {topk.dtype}")
    num_queries = topk.shape[0]
    if num_queries == 0:
        raise ValueError("no queries: topk_indices has 0 rows")
    ks = _check_k_values(k_values, topk.shape[1])
    kmax = ks[-1]
    if hasattr(mention_matrix, "tocsr"):  # scipy.sparse: row indexing needs CSR
        mention_matrix = mention_matrix.tocsr()
    else:
        mention_matrix = _as_array(mention_matrix, "mention_matrix")
        if mention_matrix.dtype != bool:
            mention_matrix = _as_bool_matrix(mention_matrix, "mention_matrix")
    if len(mention_matrix.shape) != 2:
        raise ValueError(f"mention_matrix must be 2-D [gallery x classes], got {mention_matrix.shape}")
    gallery_size, num_classes = mention_matrix.shape
    removed = _as_bool_matrix(removed, "removed")
    present = _as_bool_matrix(present, "present")
    for name, arr in (("removed", removed), ("present", present)):
        if arr.shape != (num_queries, num_classes):
            raise ValueError(
                f"{name} has shape {arr.shape}, expected (queries, classes) = "
                f"({num_queries}, {num_classes}) from topk_indices and mention_matrix"
            )
    _check_query_sets(removed, present, require_present)
    topk = topk[:, :kmax]
    if topk.min() < 0 or topk.max() >= gallery_size:
        bad = int(topk.min()) if topk.min() < 0 else int(topk.max())
        raise ValueError(f"topk_indices holds gallery index {bad}, outside the mention matrix's {gallery_size} rows")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")

    per_query = {k: np.empty(num_queries, dtype=np.float64) for k in ks}
    for q0 in range(0, num_queries, chunk_size):
        q1 = min(q0 + chunk_size, num_queries)
        idx = topk[q0:q1]
        retrieved = _gather_rows(mention_matrix, idx.ravel()).reshape(q1 - q0, kmax, num_classes)
        rel = relevance_from_mentions(retrieved, removed[q0:q1], present[q0:q1], require_present)
        for k, ap in average_precision_at_k(rel, ks).items():
            per_query[k][q0:q1] = ap
    scores = {k: float(per_query[k].mean()) for k in ks}
    return OdmapResult(scores=scores, per_query=per_query, num_queries=num_queries)


# ----------------------------------------------------------------------------- gallery mentions


def _matcher(table: TableLike | ClassMatcher) -> ClassMatcher:
    return table if isinstance(table, ClassMatcher) else ClassMatcher(table)


def gallery_mentions(
    captions: Sequence[str],
    class_names: Sequence[str],
    table: TableLike | ClassMatcher = None,
    *,
    cache: NounPhraseCache | None = None,
    batch_size: int = 10_000,
) -> np.ndarray:
    """[G x C] bool: caption g has a noun phrase that matches class c (each unique caption once).

    Pass a `NounPhraseCache` to reuse chunking across calls (and `save` it to disk); without one,
    captions are chunked in batches and only the mention rows are kept, so memory stays at
    G x C bools for a 600K-caption gallery.
    """
    from .noun_phrases import chunk_captions

    matcher = _matcher(table)
    cols = matcher.class_indices(class_names)
    unique: dict[str, int] = {}
    inverse = np.empty(len(captions), dtype=np.int64)
    for i, caption in enumerate(captions):
        if not isinstance(caption, str):
            raise ValueError(f"caption {i} is {type(caption).__name__}, expected a string")
        inverse[i] = unique.setdefault(caption, len(unique))
    texts = list(unique)
    rows = np.zeros((len(texts), len(cols)), dtype=bool)
    for b0 in range(0, len(texts), batch_size):
        batch = texts[b0 : b0 + batch_size]
        chunked = cache.get_many(batch) if cache is not None else chunk_captions(batch)
        for j, ch in enumerate(chunked):
            rows[b0 + j] = matcher.mentions(ch.noun_phrases, class_names)
        if len(texts) > batch_size:
            logger.info("noun phrases: %d / %d unique captions", b0 + len(batch), len(texts))
    return rows[inverse]


def _class_sets_to_matrix(sets: Sequence[Iterable[str]], name: str, index: dict[str, int]) -> np.ndarray:
    out = np.zeros((len(sets), len(index)), dtype=bool)
    for q, classes in enumerate(sets):
        if isinstance(classes, str):
            raise ValueError(f"{name}[{q}] must be a list of class names, got the string {classes!r}")
        for c in classes:
            out[q, index[c]] = True
    return out


def odmap(
    retrieved_captions: Sequence[Sequence[str]],
    removed_classes: Sequence[Iterable[str]],
    present_classes: Sequence[Iterable[str]],
    *,
    k_values: Iterable[int] = DEFAULT_K_VALUES,
    require_present: RequirePresent = "any",
    table: TableLike | ClassMatcher = None,
    cache: NounPhraseCache | None = None,
) -> OdmapResult:
    """ODmAP@k from the ranked caption texts retrieved for each query.

    Args:
        retrieved_captions: per query, the retrieved captions best first (>= max(k_values)).
        removed_classes: per query, the names of the removed classes R.
        present_classes: per query, the names of the present classes P.
        k_values, require_present: as in `odmap_from_topk`.
        table: class matching table (None = the paper's COCO table, Kim et al. 2023 Appendix A;
            a dict or JSON path for other datasets) or a ready `ClassMatcher`.
        cache: a `NounPhraseCache` shared across calls (each unique caption is chunked once).
    """
    _check_require_present(require_present)
    n = len(retrieved_captions)
    if len(removed_classes) != n or len(present_classes) != n:
        raise ValueError(
            f"length mismatch: {n} rankings, {len(removed_classes)} removed_classes, "
            f"{len(present_classes)} present_classes (one of each per query)"
        )
    if n == 0:
        raise ValueError("no queries: retrieved_captions is empty")
    lengths = [len(r) if not isinstance(r, str) else -1 for r in retrieved_captions]
    if -1 in lengths:
        q = lengths.index(-1)
        raise ValueError(f"retrieved_captions[{q}] must be a list of captions, got a string")
    ks = _check_k_values(k_values)
    short = [q for q, length in enumerate(lengths) if length < ks[-1]]
    if short:
        raise ValueError(
            f"k={ks[-1]} exceeds the ranking length {lengths[short[0]]} of query {short[0]} "
            f"({len(short)} queries are shorter than {ks[-1]})"
        )
    matcher = _matcher(table)
    used: list[str] = []
    for sets in (removed_classes, present_classes):
        for classes in sets:
            if not isinstance(classes, str):
                used.extend(classes)
    class_names = sorted(set(used))
    matcher.class_indices(class_names)  # ValueError naming unknown classes
    index = {c: j for j, c in enumerate(class_names)}
    removed = _class_sets_to_matrix(removed_classes, "removed_classes", index)
    present = _class_sets_to_matrix(present_classes, "present_classes", index)

    flat: list[str] = [c for ranking in retrieved_captions for c in list(ranking)[: ks[-1]]]
    unique = list(dict.fromkeys(flat))
    position = {c: i for i, c in enumerate(unique)}
    topk = np.fromiter((position[c] for c in flat), dtype=np.int64, count=len(flat))
    mentions = gallery_mentions(unique, class_names, matcher, cache=cache)
    return odmap_from_topk(
        topk.reshape(n, ks[-1]),
        mentions,
        removed,
        present,
        k_values=ks,
        require_present=require_present,
    )


def per_class_odmap(result: OdmapResult, removed_classes: Sequence[Iterable[str]]) -> dict[str, dict[int, float]]:
    """ODmAP@k per removed class: the mean AP@k of the queries that removed it (a query with
    several removed classes counts for each), classes sorted by name."""
    queries: dict[str, list[int]] = {}
    for q, classes in enumerate(removed_classes):
        for c in set(classes):
            queries.setdefault(str(c), []).append(q)
    return {c: {k: float(ap[qs].mean()) for k, ap in result.per_query.items()} for c, qs in sorted(queries.items())}


def plot_per_class(
    per_class: dict[str, dict[int, float]], path: Union[str, os.PathLike], *, title: str | None = None
) -> Path:
    """Bar chart of ODmAP@k per removed class (one bar per k), written to `path` (png/pdf/svg).

    Class names and the title are drawn as written (no mathtext: a `$` is a dollar sign).
    Needs matplotlib (`pip install matplotlib`), imported only here.
    """
    import matplotlib

    if not per_class:
        raise ValueError("no classes to plot")
    # Text objects read `text.parse_math` when created, tick labels when drawn: all inside.
    with matplotlib.rc_context({"text.parse_math": False}):
        return _draw_per_class(per_class, Path(path), title)


def _draw_per_class(per_class: dict[str, dict[int, float]], out: Path, title: str | None) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    classes = list(per_class)
    ks = sorted({k for v in per_class.values() for k in v})
    fig = Figure(figsize=(max(4.0, 0.45 * len(classes) * len(ks) + 1.5), 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / len(ks)
    x = np.arange(len(classes))
    for j, k in enumerate(ks):
        ax.bar(
            x + (j - (len(ks) - 1) / 2) * width,
            [per_class[c].get(k, np.nan) for c in classes],
            width,
            label=f"ODmAP@{k}",
        )
    values = np.array([[per_class[c].get(k, np.nan) for k in ks] for c in classes], dtype=float)
    if not np.nan_to_num(values).any():
        # Zero-height bars draw nothing: mark each value and say so, rather than empty axes.
        for j in range(len(ks)):
            ax.plot(x + (j - (len(ks) - 1) / 2) * width, np.zeros(len(classes)), "_", markersize=10, color=f"C{j}")
        ax.text(0.5, 0.5, "ODmAP@k is 0 for every class", transform=ax.transAxes, ha="center")
    ax.set_xticks(x, classes, rotation=60, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("ODmAP@k")
    ax.set_xlabel("removed class")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out
