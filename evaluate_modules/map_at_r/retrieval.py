"""mAP@R, R-Precision and Recall@K exactly as `eccv_caption` 0.1.0 defines them (Chun et al., 2022,
ECCV Caption §4; mAP@R from Musgrave et al., 2020).

Per query with positives G (R = |set(G)|) and ranked list t:

    rprecision(r) = |set(t[:r]) & G| / |set(t[:r])|   (denominator: *unique* retrieved items)
    AP@R          = (1/R) * sum_{r=1..R} 1[t[r-1] in G] * rprecision(r)
    R-Precision   = rprecision(R)      (PMRP: rprecision(min(R, 50)), `r_precision_cap=50`)
    R@1           = 1[t[0] in G];   R@K = 1[set(t[:K]) & G non-empty]

and each metric is the mean over queries. A ranking must not repeat an id: the reference counts a
repeated id once in the denominator but once per position in the AP sum, so `[10, 10, 10]`
against positives {10, 11, 12} scores mAP@R 1.0. We raise instead, naming the query;
`allow_duplicates=True` reproduces the reference for parity runs only. Queries are the keys of the
positives (extra ranked queries are ignored; a missing one is an error). Where the reference
crashes (a ranking shorter than R, an empty ranking, empty positives) we raise
`RetrievalInputError` (a `ValueError`) saying which query and what is needed.

Two entry points, both vectorised over all queries (no per-query Python loop beyond converting
ragged Python lists):

- `retrieval_scores(rankings, positives)`: ranked id lists (a dict keyed like `positives`, or
  lists / a 2-D array aligned with a list of positives);
- `retrieval_scores_from_similarity(similarity, positives, query_ids, gallery_ids)`: a
  query x gallery matrix, ranked best-first with ties in gallery order (a stable sort), of which
  only the needed prefix is ever computed (`topk.stable_topk`).

Example (the worked example of this Space's README; R@5 / R@10 would need 5 / 10 items per
ranking, so only R@1 here):
    >>> s = retrieval_scores([[10, 99, 11, 12], [99, 10, 11]], [[10, 11, 12], [10, 11, 12]],
    ...                      RetrievalMetricConfig(k_values=(1,)))
    >>> [round(float(v), 4) for v in s.per_query["map_at_r"]], s.recall_at_k
    ([0.5556, 0.3889], {1: 0.5})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .id_lists import (
    Ragged,
    check_id_lists,
    checked_positives,
    id_array,
    index_of,
    ragged_ids,
    raise_repeated,
    require_known,
    require_unique,
    show_id,
)
from .topk import INT64_IDS, RetrievalInputError, as_array, as_score_matrix, outside_int64, positive_int64, stable_topk

__all__ = [
    "RetrievalInputError",
    "RetrievalMetricConfig",
    "RetrievalScores",
    "needed_depth",
    "ranking_depth",
    "check_id_lists",
    "retrieval_scores",
    "retrieval_scores_from_similarity",
    "retrieval_scores_from_topk",
]


@dataclass(frozen=True)
class RetrievalMetricConfig:
    """Which metrics to compute. Example: `RetrievalMetricConfig(k_values=(1,), map_at_r=False)`
    for R@1 only (then rankings need just one item)."""

    k_values: tuple[int, ...] = (1, 5, 10)
    map_at_r: bool = True
    r_precision: bool = True
    #: R-Precision looks at min(R, cap) items; the paper's modified PMRP uses 50. None: R.
    r_precision_cap: int | None = None
    #: Score rankings that repeat an id the way eccv_caption 0.1.0 does (parity runs only: it
    #: lets `[10, 10, 10]` reach mAP@R 1.0 on positives {10, 11, 12}). False: a repeat raises.
    allow_duplicates: bool = False

    def __post_init__(self) -> None:
        for k in self.k_values:
            if not positive_int64(k):
                raise RetrievalInputError(f"k_values must be positive integers up to 2**63 - 1, got {k!r}")
        cap = self.r_precision_cap
        if cap is not None and not positive_int64(cap):
            raise RetrievalInputError(f"r_precision_cap must be a positive integer up to 2**63 - 1, got {cap!r}")
        if not (self.k_values or self.map_at_r or self.r_precision):
            raise RetrievalInputError("no metric selected: give k_values or enable map_at_r / r_precision")


@dataclass(frozen=True)
class RetrievalScores:
    """Means over queries, plus per-query values (in query order) for analysis / CIs."""

    map_at_r: float | None
    r_precision: float | None
    recall_at_k: dict[int, float]
    num_queries: int
    query_ids: np.ndarray = field(repr=False)
    per_query: dict[str, np.ndarray] = field(repr=False)

    def as_dict(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.map_at_r is not None:
            out["map_at_r"] = self.map_at_r
        if self.r_precision is not None:
            out["r_precision"] = self.r_precision
        out.update({f"recall_at_{k}": v for k, v in self.recall_at_k.items()})
        return out


# ----------------------------------------------------------------------------- public API


def retrieval_scores(
    rankings: Any,
    positives: Mapping[Any, Sequence[int]] | Sequence[Sequence[int]],
    config: RetrievalMetricConfig | None = None,
) -> RetrievalScores:
    """The metrics of `config` from ranked id lists.

    `positives` is either a dict query id -> positive ids (then `rankings` is a dict with at
    least those keys, as in `eccv_caption`) or a list aligned with `rankings` (a list of lists or
    a [queries x L] int array / tensor). Rankings may be truncated: each query needs max(R, K)
    items for mAP@R / R-Precision / R@K (fewer raises `RetrievalInputError`).
    """
    cfg = config or RetrievalMetricConfig()
    query_ids, pos_lists = _positive_lists(positives)
    ranked_rows = _ranking_rows(rankings, positives, query_ids)
    return _score(ranked_rows, checked_positives(pos_lists, query_ids), query_ids, cfg)


def retrieval_scores_from_similarity(
    similarity: Any,
    positives: Mapping[Any, Sequence[int]] | Sequence[Sequence[int]],
    query_ids: Sequence[int] | np.ndarray | None = None,
    gallery_ids: Sequence[int] | np.ndarray | None = None,
    config: RetrievalMetricConfig | None = None,
) -> RetrievalScores:
    """The metrics of `config` from a [queries x gallery] score matrix (higher = better).

    Rows are `query_ids` (default 0..Q-1) and columns `gallery_ids` (default 0..N-1). With a
    dict of positives, its keys select and order the queries; with a list, it is aligned with
    the rows. Every positive must be a gallery id. Identical to running `retrieval_scores` on
    `np.argsort(-similarity, axis=1, kind="stable")` mapped to gallery ids.
    """
    cfg = config or RetrievalMetricConfig()
    scores = as_score_matrix(similarity)
    n_rows, n_cols = scores.shape
    q_ids = id_array(np.arange(n_rows) if query_ids is None else query_ids, "query_ids")
    g_ids = id_array(np.arange(n_cols) if gallery_ids is None else gallery_ids, "gallery_ids")
    if len(q_ids) != n_rows or len(g_ids) != n_cols:
        raise RetrievalInputError(
            f"similarity has shape {tuple(scores.shape)} but there are {len(q_ids)} query_ids "
            f"and {len(g_ids)} gallery_ids (rows are queries, columns gallery items)"
        )
    require_unique(g_ids, "gallery_ids")
    rows = None
    if isinstance(positives, Mapping):
        require_unique(q_ids, "query_ids")
        wanted, pos_lists = _positive_lists(positives)
        rows = index_of(q_ids, wanted, "query id", "query_ids (the similarity rows)")
        if len(rows) == n_rows and (rows == np.arange(n_rows)).all():
            rows = None  # every row, in order: no gather needed
    else:
        wanted, pos_lists = q_ids, list(positives)
        if len(pos_lists) != n_rows:
            raise RetrievalInputError(
                f"similarity has {n_rows} rows but positives has {len(pos_lists)} lists (one per row)"
            )
    pos = checked_positives(pos_lists, wanted)
    require_known(pos, wanted, g_ids)
    depth = int(needed_depth(_unique_counts(pos), cfg).max(initial=0))
    top = stable_topk(scores, depth, rows=rows)
    # A complete ranking of a gallery smaller than K is not "too short" for R@K.
    return _score(g_ids[top], pos, wanted, cfg, depth_cap=n_cols)


def retrieval_scores_from_topk(
    topk_ids: Any,
    topk_query_ids: Sequence[int] | np.ndarray,
    positives: Mapping[Any, Sequence[int]],
    config: RetrievalMetricConfig | None = None,
    gallery_size: int | None = None,
) -> RetrievalScores:
    """The metrics from ranking prefixes [n x depth] whose rows are `topk_query_ids`.

    For top-k lists from a nearest-neighbour index or `stable_topk`: the queries are the keys of
    `positives` (each must be a row). `gallery_size`, when given, lets a prefix holding the whole
    gallery satisfy R@K for K above it.
    """
    cfg = config or RetrievalMetricConfig()
    top = as_array(topk_ids)
    row_ids = id_array(topk_query_ids, "topk_query_ids")
    if top.ndim != 2 or len(top) != len(row_ids):
        raise RetrievalInputError(
            f"topk_ids must be 2-D with one row per topk_query_id, got shape {top.shape} for {len(row_ids)} query ids"
        )
    require_unique(row_ids, "topk_query_ids")
    wanted, pos_lists = _positive_lists(positives)
    rows = index_of(row_ids, wanted, "query id", "topk_query_ids")
    return _score(top[rows], checked_positives(pos_lists, wanted), wanted, cfg, depth_cap=gallery_size)


def ranking_depth(
    positives: Mapping[Any, Sequence[int]] | Sequence[Sequence[int]], config: RetrievalMetricConfig | None = None
) -> int:
    """How many ranked items per query `config` needs at most (max over queries of max(R, K))."""
    cfg = config or RetrievalMetricConfig()
    query_ids, pos_lists = _positive_lists(positives)
    pos = checked_positives(pos_lists, query_ids)
    return int(needed_depth(_unique_counts(pos), cfg).max(initial=0))


# ----------------------------------------------------------------------------- input shaping


def _positive_lists(positives: Any) -> tuple[np.ndarray, list]:
    if isinstance(positives, Mapping):
        keys = list(positives.keys())
        # Query keys are only labels here (integers when they must match matrix rows).
        ids = np.asarray(keys)
        big = None if ids.dtype.kind in "ib" else outside_int64(ids if ids.dtype.kind == "u" else keys)
        if big is not None:
            raise RetrievalInputError(f"positives holds query id {big}; {INT64_IDS}")
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            ids = np.empty(len(keys), dtype=object)
            ids[:] = keys
        return ids.astype(np.int64) if ids.dtype.kind in "iu" else ids, list(positives.values())
    if isinstance(positives, (str, bytes)) or not isinstance(positives, Sequence):
        raise RetrievalInputError(
            "positives must be a dict query id -> positive ids, or a list "
            f"of positive-id lists, got {type(positives).__name__}"
        )
    return np.arange(len(positives)), list(positives)


def _ranking_rows(rankings: Any, positives: Any, query_ids: np.ndarray) -> Any:
    """`rankings` as something indexable by query position (a list or a 2-D array)."""
    if isinstance(positives, Mapping):
        if not isinstance(rankings, Mapping):
            raise RetrievalInputError(
                f"positives is a dict keyed by query id, so rankings must be a dict too, got {type(rankings).__name__}"
            )
        missing = [q for q in positives if q not in rankings]
        if missing:
            raise RetrievalInputError(
                f"no ranking for query {show_id(missing[0])} ({len(missing)} of {len(positives)} "
                f"queries missing, e.g. {', '.join(show_id(m) for m in missing[:5])}); rank every query "
                "of the ground truth"
            )
        return [rankings[q] for q in positives]
    if hasattr(rankings, "detach"):  # a torch tensor
        rankings = as_array(rankings)
    if isinstance(rankings, Mapping):
        raise RetrievalInputError("rankings is a dict, so positives must be a dict with the same query ids")
    if len(rankings) != len(query_ids):
        raise RetrievalInputError(
            f"{len(rankings)} rankings but {len(query_ids)} positive lists: pass one of each per query"
        )
    if isinstance(rankings, np.ndarray) and rankings.ndim != 2:
        raise RetrievalInputError(f"a rankings array must be 2-D (queries x L), got shape {rankings.shape}")
    return rankings


def _unique_counts(pos: Ragged) -> np.ndarray:
    """R per query: the number of distinct positives (the reference takes set(G))."""
    uniq, codes = np.unique(pos.values, return_inverse=True)
    keys = np.unique(pos.rows * len(uniq) + codes)
    return np.bincount(keys // len(uniq), minlength=len(pos.lengths))


def needed_depth(r: np.ndarray, cfg: RetrievalMetricConfig) -> np.ndarray:
    """Ranked items each query needs, given its number of positives R."""
    need = np.full(len(r), max(cfg.k_values, default=0), dtype=np.int64)
    if cfg.map_at_r:
        need = np.maximum(need, r)
    if cfg.r_precision:
        need = np.maximum(need, _rp_depth(r, cfg))
    return need


def _rp_depth(r: np.ndarray, cfg: RetrievalMetricConfig) -> np.ndarray:
    return r if cfg.r_precision_cap is None else np.minimum(r, cfg.r_precision_cap)


# ----------------------------------------------------------------------------- the metrics


def _score(
    ranked_rows: Any, pos: Ragged, query_ids: np.ndarray, cfg: RetrievalMetricConfig, depth_cap: int | None = None
) -> RetrievalScores:
    """The metrics from (already validated, non-empty) positives and rankings in query order."""
    n_q = len(pos.lengths)
    r = _unique_counts(pos)
    need = needed_depth(r, cfg)
    if depth_cap is not None:
        need = np.minimum(need, depth_cap)
    ranked = ragged_ids(ranked_rows, need, query_ids, "ranking")
    short = np.flatnonzero(ranked.lengths < np.maximum(need, 1))
    if len(short):
        i = short[0]
        raise RetrievalInputError(
            f"the ranking of query {show_id(query_ids[i])} has {ranked.lengths[i]} items but "
            f"{need[i]} are needed ({_needs(r[i], cfg)}); {len(short)} of {n_q} rankings are "
            "too short — retrieve more items per query or drop the metric that needs them"
        )

    # Membership of (query, id) pairs, on dense id codes so the pair keys fit in int64.
    uniq, codes = np.unique(np.concatenate((ranked.values, pos.values)), return_inverse=True)
    n_codes = len(uniq)
    rows = ranked.rows
    r_keys = rows * n_codes + codes[: len(ranked.values)]
    p_keys = pos.rows * n_codes + codes[len(ranked.values) :]
    hit = np.isin(r_keys, p_keys)
    # np.unique's return_index sorts stably, so it marks the first occurrence in each row.
    first = np.zeros(len(r_keys), dtype=bool)
    first[np.unique(r_keys, return_index=True)[1]] = True
    starts = ranked.starts
    if not cfg.allow_duplicates and not first.all():
        raise_repeated(ranked, first, query_ids)
    position = np.arange(len(r_keys)) - np.repeat(starts, ranked.lengths)
    # rprecision(p + 1) at every ranked position p: unique hits / unique items so far.
    rprec = _row_cumsum(first & hit, starts, ranked.lengths) / _row_cumsum(first, starts, ranked.lengths)
    per_query: dict[str, np.ndarray] = {}
    if cfg.map_at_r:
        in_r = hit & (position < r[rows])
        per_query["map_at_r"] = np.bincount(rows, weights=np.where(in_r, rprec, 0.0), minlength=n_q) / r
    if cfg.r_precision:
        per_query["r_precision"] = rprec[starts + _rp_depth(r, cfg) - 1]
    if cfg.k_values:
        first_hit = np.full(n_q, np.iinfo(np.int64).max)
        hit_rows, first_of_row = np.unique(rows[hit], return_index=True)
        first_hit[hit_rows] = position[hit][first_of_row]
        for k in sorted(set(int(k) for k in cfg.k_values)):
            per_query[f"recall_at_{k}"] = (first_hit < k).astype(np.float64)
    means = {name: float(np.mean(v)) for name, v in per_query.items()}
    return RetrievalScores(
        map_at_r=means.get("map_at_r"),
        r_precision=means.get("r_precision"),
        recall_at_k={int(name.rsplit("_", 1)[1]): v for name, v in means.items() if name.startswith("recall_at_")},
        num_queries=n_q,
        query_ids=query_ids,
        per_query=per_query,
    )


def _row_cumsum(x: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    total = np.cumsum(x, dtype=np.int64)
    before_row = total[starts] - x[starts]
    return (total - np.repeat(before_row, lengths)).astype(np.float64)


def _needs(r: int, cfg: RetrievalMetricConfig) -> str:
    parts = []
    if cfg.map_at_r:
        parts.append(f"mAP@R with R={r}")
    if cfg.r_precision:
        parts.append(f"R-Precision at {int(_rp_depth(np.array([r]), cfg)[0])}")
    if cfg.k_values:
        parts.append(f"R@{max(cfg.k_values)}" if max(cfg.k_values) > 1 else "R@1")
    return ", ".join(parts)
