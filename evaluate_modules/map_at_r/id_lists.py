"""Ids and id lists for the retrieval metrics: checked, named in every error, stored flat.

The checks `retrieval.py` runs on its inputs before scoring (integer ids within int64, unique
query and gallery ids, every positive among the gallery, no empty positives, no repeated id in a
ranking), each raising `RetrievalInputError` with the query it concerns, and `Ragged`, the flat
storage of variable-length id rows the metrics are vectorised over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .topk import INT64, INT64_IDS, RetrievalInputError, as_array, require_int64


@dataclass(frozen=True)
class Ragged:
    """Rows of int64 ids stored flat: row i is values[starts[i] : starts[i] + lengths[i]]."""

    values: np.ndarray
    lengths: np.ndarray

    @property
    def rows(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.lengths)), self.lengths)

    @property
    def starts(self) -> np.ndarray:
        return np.concatenate(([0], np.cumsum(self.lengths)[:-1])).astype(np.int64)


def show_id(x: Any) -> str:
    """A query id as the user wrote it: 7, 'b'."""
    return repr(x.item() if isinstance(x, np.generic) else x)


def preview(row: Any) -> str:
    text = repr(row)
    return text if len(text) <= 60 else text[:57] + "..."


def id_array(ids: Any, name: str) -> np.ndarray:
    arr = as_array(ids)
    require_int64(arr, ids, name)
    if arr.size == 0:
        return arr.astype(np.int64).reshape(-1)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise RetrievalInputError(f"{name} must be a flat list of integer ids, got {arr.dtype} with shape {arr.shape}")
    return arr.astype(np.int64, copy=False)


def require_unique(ids: np.ndarray, name: str) -> None:
    uniq, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise RetrievalInputError(
            f"{name} has duplicates, e.g. {int(uniq[counts > 1][0])}; each row / column must have its own id"
        )


def ragged_ids(rows: Any, cap: np.ndarray | None, query_ids: np.ndarray, what: str) -> Ragged:
    """Ragged int64 rows, each cut at cap[i] items (no cut when cap is None)."""
    if isinstance(rows, np.ndarray):
        require_int64(rows, rows, what)
        if rows.size and rows.dtype.kind not in "iu":
            raise RetrievalInputError(f"{what} must hold integer ids, got dtype {rows.dtype}")
        width = rows.shape[1]
        lengths = np.full(len(rows), width, dtype=np.int64)
        if cap is not None:
            lengths = np.minimum(lengths, cap)
        keep = np.arange(width)[None, :] < lengths[:, None]
        return Ragged(rows[keep].astype(np.int64, copy=False), lengths)
    parts = []
    for i, row in enumerate(rows):
        if cap is not None:
            row = row[: int(cap[i])]
        arr = np.asarray(row)
        require_int64(arr, row, f"{what} of query {show_id(query_ids[i])}")
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise RetrievalInputError(
                f"{what} of query {show_id(query_ids[i])} must be a flat list of integer ids, got {preview(row)}"
            )
        parts.append(arr.astype(np.int64, copy=False))
    lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    values = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    return Ragged(values, lengths)


def checked_positives(pos_lists: list, query_ids: np.ndarray) -> Ragged:
    pos = ragged_ids(pos_lists, None, query_ids, "positives")
    if len(pos.lengths) == 0:
        raise RetrievalInputError("no queries: positives is empty")
    empty = np.flatnonzero(pos.lengths == 0)
    if len(empty):
        raise RetrievalInputError(
            f"query {show_id(query_ids[empty[0]])} has no positives ({len(empty)} such queries); "
            "mAP@R, R-Precision and R@K are undefined without positives — drop those queries"
        )
    return pos


def require_known(pos: Ragged, query_ids: np.ndarray, gallery_ids: np.ndarray) -> None:
    unknown = ~np.isin(pos.values, gallery_ids)
    if unknown.any():
        first = int(np.flatnonzero(unknown)[0])
        query = query_ids[np.searchsorted(np.cumsum(pos.lengths), first, side="right")]
        raise RetrievalInputError(
            f"positive id {int(pos.values[first])} of query {show_id(query)} is not among the "
            f"gallery_ids ({unknown.sum()} unknown positive ids in total); the positives and the "
            "similarity columns must use the same ids"
        )


def index_of(haystack: np.ndarray, needles: np.ndarray, what: str, where: str) -> np.ndarray:
    """Positions of `needles` in the unique id array `haystack`; unknown ids raise."""
    found = np.zeros(len(needles), dtype=np.int64)
    ok = np.zeros(len(needles), dtype=bool)
    if len(haystack):
        order = np.argsort(haystack, kind="stable")
        found = order[np.minimum(np.searchsorted(haystack, needles, sorter=order), len(haystack) - 1)]
        ok = haystack[found] == needles
    if not ok.all():
        missing = needles[~ok]
        raise RetrievalInputError(
            f"{what} {show_id(missing[0])} is not among the {where} ({len(missing)} missing, e.g. "
            f"{', '.join(show_id(m) for m in missing[:5])})"
        )
    return found


def raise_repeated(ranked: Ragged, first: np.ndarray, query_ids: np.ndarray) -> None:
    at = int(np.flatnonzero(~first)[0])
    row = int(ranked.rows[at])
    start = int(ranked.starts[row])
    repeated = ranked.values[at]
    positions = np.flatnonzero(ranked.values[start : at + 1] == repeated)
    n_rows = len(np.unique(ranked.rows[~first]))
    raise RetrievalInputError(
        f"the ranking of query {show_id(query_ids[row])} repeats id {int(repeated)} (positions "
        f"{int(positions[0])} and {int(positions[-1])}; {n_rows} rankings repeat ids): a ranking "
        "lists each gallery item once — deduplicate it (allow_duplicates=True scores repeats "
        "like eccv_caption 0.1.0, for parity runs only)"
    )


def check_id_lists(rows: Any, name: str, *, single: bool = False) -> None:
    """Raise unless every row of `rows` is a list of integer ids (not floats, not bools); with
    `single`, `rows` is the one query of evaluate's `add`.

    For the evaluate module, which must check before its Arrow features would silently turn
    10.7 into 10 and True into 1.
    """
    if rows is None:
        raise RetrievalInputError(f"{name} is missing: pass one list of integer ids per query")
    if single:
        rows = [as_array(rows) if hasattr(rows, "detach") else rows]
    elif hasattr(rows, "detach") or isinstance(rows, np.ndarray):
        arr = as_array(rows)
        require_int64(arr, arr, name)
        if arr.size and (arr.dtype.kind not in "iu" or arr.ndim != 2):
            raise RetrievalInputError(
                f"{name} must be [queries x n] integer ids, got {arr.dtype} with shape {arr.shape}"
            )
        return
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise RetrievalInputError(f"{name} must be a list of integer-id lists, got {type(rows).__name__}")
    for q, row in enumerate(rows):
        where = f"{name} (the added query)" if single else f"{name}[{q}] (query {q})"
        if isinstance(row, (str, bytes)) or not isinstance(row, (Sequence, np.ndarray)):
            raise RetrievalInputError(f"{where} must be a list of integer ids, got {preview(row)}")
        for item in row:
            if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
                raise RetrievalInputError(
                    f"{where} holds {item!r} ({type(item).__name__}); ids must be integers — "
                    "floats are not truncated and bools are not 0/1 here"
                )
            if not INT64.min <= int(item) <= INT64.max:  # Arrow's int64 would overflow
                raise RetrievalInputError(f"{where} holds {int(item)}; {INT64_IDS}")
