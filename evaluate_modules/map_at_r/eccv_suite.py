"""The ECCV Caption evaluation suite: `eccv_caption.Metrics.compute_all_metrics`, vectorised.

Same inputs (i2t rankings keyed by COCO image id, t2i rankings keyed by COCO caption id), same
target-metric names and the same output layout `{metric: {"i2t": x, "t2i": y}}`, computed with
`retrieval` on the annotations shipped in `eccv_caption` 0.1.0 (read by `eccv_annotations`):

    coco_5k_r{K}     R@K on the original COCO pairs of the 5K test split
    coco_1k_r{K}     mean over the five folds (5,000 consecutive ids of `coco_test_ids.npy` and
                     their 1,000 images) of R@K on rankings filtered to the fold
    cxc_r{K}         R@K on CxC positives
    eccv_map_at_r, eccv_rprecision, eccv_r{K}   on ECCV Caption positives
    pmrp             R-Precision at min(R, 50) on plausible-match positives (ζ = 0 in the paper)

`{name}_r1` asks for R@1 and `{name}_recalls` for R@K for every K of `k_values`, as in the
reference. Deliberate differences (the reference's bugs, not its definitions):

- `eccv_rprecision` alone returns R-Precision (the reference misspells the key and returns
  nothing); `eccv_recalls` together with `eccv_map_at_r` returns both (the reference drops the
  recalls); `pmrp` is reported under `pmrp` (the reference returns bare "i2t"/"t2i" keys);
  unknown metric names and a missing PM ground truth raise instead of being ignored.
- PMRP cuts rankings at 50, the paper's modified PMRP; the reference equals it on top-50 lists.
- Rankings too short for a metric (after COCO 1K fold filtering, too) raise
  `RetrievalInputError` instead of an IndexError or a silently lower R@K.

`eccv_suite_from_similarity` computes the same numbers from an images x captions score matrix
(stable ranking: ties in column order), touching only the needed ranking prefixes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .eccv_annotations import Positives, coco_test_caption_ids, read_positives
from .retrieval import (
    RetrievalInputError,
    RetrievalMetricConfig,
    RetrievalScores,
    needed_depth,
    retrieval_scores,
    retrieval_scores_from_similarity,
    retrieval_scores_from_topk,
)
from .topk import as_array, as_score_matrix, require_int64, stable_topk

__all__ = [
    "DEFAULT_TARGET_METRICS",
    "EccvAnnotations",
    "EccvSuiteConfig",
    "VALID_METRICS",
    "eccv_suite",
    "eccv_suite_from_similarity",
]

MODALITIES = ("i2t", "t2i")
VALID_METRICS = (
    "coco_1k_r1",
    "coco_5k_r1",
    "cxc_r1",
    "coco_1k_recalls",
    "coco_5k_recalls",
    "cxc_recalls",
    "eccv_r1",
    "eccv_rprecision",
    "eccv_map_at_r",
    "eccv_recalls",
    "pmrp",
)
DEFAULT_TARGET_METRICS = ("coco_1k_r1", "coco_5k_r1", "cxc_r1", "eccv_r1", "eccv_map_at_r")
N_FOLDS = 5


@dataclass(frozen=True)
class EccvSuiteConfig:
    """Example: `EccvSuiteConfig(target_metrics=("eccv_map_at_r", "coco_5k_recalls"))`."""

    target_metrics: tuple[str, ...] = DEFAULT_TARGET_METRICS
    k_values: tuple[int, ...] = (1, 5, 10)
    #: PMRP looks at min(R, pmrp_cap) items (the paper's modified PMRP).
    pmrp_cap: int = 50
    #: Score rankings that repeat an id like eccv_caption 0.1.0 (parity runs only; see
    #: `RetrievalMetricConfig.allow_duplicates`). False: a repeat raises.
    allow_duplicates: bool = False

    def __post_init__(self) -> None:
        unknown = sorted(set(self.target_metrics) - set(VALID_METRICS))
        if unknown:
            raise RetrievalInputError(f"unknown target metric(s) {unknown}; choose from {', '.join(VALID_METRICS)}")
        if not self.target_metrics:
            raise RetrievalInputError(f"target_metrics is empty; choose from {', '.join(VALID_METRICS)}")


@dataclass(frozen=True)
class EccvAnnotations:
    """Ground truths of the suite. `EccvAnnotations.load()` reads the shipped ones; PM positives
    (for `pmrp`) come from `eccv_annotations.read_pm_positives` / `pm_positives_from_instances`."""

    eccv: Positives
    cxc: Positives
    coco: Positives
    #: The 25,000 test caption ids, in the order that defines the COCO 1K folds.
    coco_test_ids: np.ndarray
    pm: Positives | None = None

    @classmethod
    def load(cls, pm: Positives | None = None) -> EccvAnnotations:
        return cls(
            eccv=read_positives("eccv"),
            cxc=read_positives("cxc"),
            coco=read_positives("coco"),
            coco_test_ids=coco_test_caption_ids(),
            pm=pm,
        )

    def test_ids(self, modality: str) -> np.ndarray:
        """The gallery of a modality: caption ids for i2t, image ids for t2i."""
        if modality == "i2t":
            return self.coco_test_ids
        return np.asarray(list(self.coco.i2t), dtype=np.int64)

    def coco_1k_folds(self) -> list[dict[str, dict[int, np.ndarray]]]:
        """Per fold, the COCO positives restricted to it: {"i2t": {...}, "t2i": {...}}."""
        size = len(self.coco_test_ids) // N_FOLDS
        folds = []
        for f in range(N_FOLDS):
            captions = self.coco_test_ids[f * size : (f + 1) * size]
            t2i = {int(c): self.coco.t2i[int(c)] for c in captions}
            images = dict.fromkeys(int(v[0]) for v in t2i.values())
            folds.append({"i2t": {i: self.coco.i2t[i] for i in images}, "t2i": t2i})
        return folds


@dataclass(frozen=True)
class _Task:
    """One ground truth scored with one metric config; `prefix` names its output keys."""

    prefix: str
    positives: Positives | None  # None: the COCO 1K folds
    config: RetrievalMetricConfig


def _tasks(cfg: EccvSuiteConfig, ann: EccvAnnotations) -> list[_Task]:
    targets = set(cfg.target_metrics)
    ks = tuple(sorted(set(int(k) for k in cfg.k_values)))

    def recall_ks(name: str) -> tuple[int, ...]:
        if f"{name}_recalls" in targets:
            return ks
        return (1,) if f"{name}_r1" in targets else ()

    dup = cfg.allow_duplicates
    tasks = []
    for name, positives in (("coco_1k", None), ("coco_5k", ann.coco), ("cxc", ann.cxc)):
        if recall_ks(name):
            tasks.append(
                _Task(
                    name,
                    positives,
                    RetrievalMetricConfig(
                        k_values=recall_ks(name), map_at_r=False, r_precision=False, allow_duplicates=dup
                    ),
                )
            )
    eccv = dict(
        k_values=recall_ks("eccv"), map_at_r="eccv_map_at_r" in targets, r_precision="eccv_rprecision" in targets
    )
    if any(eccv.values()):
        tasks.append(_Task("eccv", ann.eccv, RetrievalMetricConfig(**eccv, allow_duplicates=dup)))
    if "pmrp" in targets:
        if ann.pm is None:
            raise RetrievalInputError(
                "pmrp needs plausible-match positives, which eccv_caption does not ship: pass "
                "coco_instances=<instances_val2014.json> (PM positives computed from it) or "
                "pm_dir=<folder with the official pm_*.json files>"
            )
        tasks.append(
            _Task(
                "pmrp",
                ann.pm,
                RetrievalMetricConfig(
                    k_values=(), map_at_r=False, r_precision=True, r_precision_cap=cfg.pmrp_cap, allow_duplicates=dup
                ),
            )
        )
    return tasks


def _named(prefix: str, scores: RetrievalScores) -> dict[str, float]:
    if prefix == "pmrp":
        return {"pmrp": scores.r_precision}
    out = {f"{prefix}_r{k}": v for k, v in scores.recall_at_k.items()}
    if scores.map_at_r is not None:
        out[f"{prefix}_map_at_r"] = scores.map_at_r
    if scores.r_precision is not None:
        out[f"{prefix}_rprecision"] = scores.r_precision
    return out


def _merge(results: dict[str, dict[str, float]], modality: str, values: dict[str, float]) -> None:
    for key, value in values.items():
        results.setdefault(key, {})[modality] = float(value)


def _in_context(task: str, modality: str, err: RetrievalInputError) -> RetrievalInputError:
    return RetrievalInputError(f"{task} ({modality}): {err}")


# ----------------------------------------------------------------------------- from rankings


def eccv_suite(
    i2t: Mapping[int, Sequence[int]],
    t2i: Mapping[int, Sequence[int]],
    config: EccvSuiteConfig | None = None,
    annotations: EccvAnnotations | None = None,
) -> dict[str, dict[str, float]]:
    """The suite from ranked id lists: i2t image id -> caption ids, t2i caption id -> image ids."""
    cfg = config or EccvSuiteConfig()
    ann = annotations or EccvAnnotations.load()
    tasks = _tasks(cfg, ann)
    checked = {}
    for modality, rankings in (("i2t", i2t), ("t2i", t2i)):  # both, before any scoring
        if not isinstance(rankings, Mapping):
            raise RetrievalInputError(
                f"{modality} rankings must be a dict query id -> ranked ids, got {type(rankings).__name__}"
            )
        checked[modality] = _ranking_arrays(rankings, modality)
        _check_ranked_ids(checked[modality], ann.test_ids(modality), modality)
    results: dict[str, dict[str, float]] = {}
    for modality, rankings in checked.items():
        for task in tasks:
            try:
                if task.positives is None:
                    values = _coco_1k_from_rankings(rankings, ann, modality, task.config)
                else:
                    values = _named(
                        task.prefix, retrieval_scores(rankings, getattr(task.positives, modality), task.config)
                    )
            except RetrievalInputError as err:
                raise _in_context(task.prefix, modality, err) from None
            _merge(results, modality, values)
    return results


def _ranking_arrays(rankings: Mapping[int, Any], modality: str) -> dict[int, np.ndarray]:
    """Each ranking as a flat int64 array, converted once; anything else (a bare id, a string, a
    nested list, floats, bools, ids beyond int64) raises naming the query."""
    arrays = {}
    for query, ranking in rankings.items():
        where = f"{modality}_rankings[{query!r}]"
        arr = None if isinstance(ranking, (str, bytes)) else as_array(ranking)
        if arr is None or arr.ndim != 1:
            text = repr(ranking)
            raise RetrievalInputError(
                f"{where} must be a list of integer COCO ids (best first), "
                f"got {text if len(text) <= 60 else text[:57] + '...'}"
            )
        require_int64(arr, ranking, where)
        if arr.size and arr.dtype.kind not in "iu":
            bad = next(
                (x for x in ranking if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer))), arr[0]
            )
            raise RetrievalInputError(
                f"{where} holds {bad!r} ({type(bad).__name__}); COCO ids are "
                "integers (floats are not truncated, bools are not 0/1)"
            )
        arrays[query] = arr.astype(np.int64, copy=False)
    return arrays


def _check_ranked_ids(rankings: Mapping[int, np.ndarray], gallery: np.ndarray, modality: str) -> None:
    """Ids outside the 5K test split mean swapped modalities or another id space."""
    sample = [r[:50] for r in rankings.values()]
    flat = np.concatenate(sample) if sample else np.empty(0, dtype=np.int64)
    unknown = flat[~np.isin(flat, gallery)]
    if len(unknown):
        what = "caption" if modality == "i2t" else "image"
        raise RetrievalInputError(
            f"{modality} rankings contain {len(unknown)} ids that are not COCO 5K test {what} ids, "
            f"e.g. {unknown[:5].tolist()} (are i2t and t2i swapped, or are these indices instead "
            "of COCO ids?)"
        )


def _coco_1k_from_rankings(
    rankings: Mapping[int, Sequence[int]], ann: EccvAnnotations, modality: str, config: RetrievalMetricConfig
) -> dict[str, float]:
    fold_means = []
    for f, fold in enumerate(ann.coco_1k_folds()):
        positives = fold[modality]
        gallery = np.fromiter(fold["t2i" if modality == "i2t" else "i2t"], dtype=np.int64)
        missing = [q for q in positives if q not in rankings]
        if missing:
            raise RetrievalInputError(f"no ranking for query {missing[0]} ({len(missing)} missing)")
        rows = [np.asarray(rankings[q]) for q in positives]
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        flat = np.concatenate(rows).astype(np.int64, copy=False)
        keep = np.isin(flat, gallery)
        # Filter every ranking to the fold (vectorised), then split it back into rows.
        kept_lengths = np.bincount(np.repeat(np.arange(len(rows)), lengths)[keep], minlength=len(rows))
        filtered = np.split(flat[keep], np.cumsum(kept_lengths)[:-1])
        try:
            scores = retrieval_scores(dict(zip(positives, filtered, strict=True)), positives, config)
        except RetrievalInputError as err:
            raise RetrievalInputError(
                f"fold {f + 1}, after keeping only the fold's items: {err}; "
                "COCO 1K needs longer rankings or the similarity matrix"
            ) from None
        fold_means.append(_named("coco_1k", scores))
    return {key: float(np.mean([m[key] for m in fold_means])) for key in fold_means[0]}


# ----------------------------------------------------------------------------- from similarities


def eccv_suite_from_similarity(
    i2t_similarity: Any,
    image_ids: Sequence[int] | np.ndarray,
    caption_ids: Sequence[int] | np.ndarray,
    config: EccvSuiteConfig | None = None,
    annotations: EccvAnnotations | None = None,
    t2i_similarity: Any = None,
) -> dict[str, dict[str, float]]:
    """The suite from an [images x captions] score matrix whose rows are `image_ids` and columns
    `caption_ids`: the 5,000 images and 25,000 captions of the COCO 5K test split, in any order.
    t2i uses its transpose unless a [captions x images] `t2i_similarity` is given (a model with
    asymmetric scores). Ties rank in row / column order, as a stable sort would."""
    cfg = config or EccvSuiteConfig()
    ann = annotations or EccvAnnotations.load()
    tasks = _tasks(cfg, ann)
    scores = as_score_matrix(i2t_similarity, "i2t_similarity")
    images = _split_ids(image_ids, ann.test_ids("t2i"), "image")
    captions = _split_ids(caption_ids, ann.test_ids("i2t"), "caption")
    if tuple(scores.shape) != (len(images), len(captions)):
        raise RetrievalInputError(
            f"i2t_similarity has shape {tuple(scores.shape)} but there are {len(images)} "
            f"image_ids and {len(captions)} caption_ids (rows are images, columns captions)"
        )
    if t2i_similarity is None:
        t2i_scores = scores.T
    else:
        t2i_scores = as_score_matrix(t2i_similarity, "t2i_similarity")
        if tuple(t2i_scores.shape) != (len(captions), len(images)):
            raise RetrievalInputError(
                f"t2i_similarity must be captions x images "
                f"{(len(captions), len(images))}, got "
                f"{tuple(t2i_scores.shape)}"
            )
    views = {"i2t": (scores, images, captions), "t2i": (t2i_scores, captions, images)}
    results: dict[str, dict[str, float]] = {}
    whole = [t for t in tasks if t.positives is not None]
    for modality, (matrix, row_ids, col_ids) in views.items():
        depth = max((_depth_bound(getattr(t.positives, modality), t.config) for t in whole), default=0)
        # One stable top-k of every row, deep enough for all whole-split tasks.
        top = col_ids[stable_topk(matrix, depth)] if whole else None
        for task in whole:
            try:
                values = _named(
                    task.prefix,
                    retrieval_scores_from_topk(
                        top, row_ids, getattr(task.positives, modality), task.config, gallery_size=len(col_ids)
                    ),
                )
            except RetrievalInputError as err:
                raise _in_context(task.prefix, modality, err) from None
            _merge(results, modality, values)
    for task in tasks:
        if task.positives is None:
            for modality, values in _coco_1k_from_similarity(views, ann, task.config).items():
                _merge(results, modality, values)
    return results


def _depth_bound(positives: dict[int, np.ndarray], config: RetrievalMetricConfig) -> int:
    """`ranking_depth` with R bounded by the list length: cheap, and never shallower."""
    longest = max((len(v) for v in positives.values()), default=0)
    return int(needed_depth(np.array([longest]), config)[0])


def _split_ids(ids: Sequence[int] | np.ndarray, split: np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(ids)
    require_int64(arr, ids, f"{what}_ids")
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise RetrievalInputError(f"{what}_ids must be a flat list of integer COCO ids")
    arr = arr.astype(np.int64)
    outside = arr[~np.isin(arr, split)]
    missing = split[~np.isin(split, arr)]
    if len(outside) or len(missing) or len(np.unique(arr)) != len(arr):
        raise RetrievalInputError(
            f"{what}_ids must be the {len(split)} distinct COCO 5K test {what} ids (got "
            f"{len(arr)}: {len(outside)} outside the split, e.g. {outside[:3].tolist()}; "
            f"{len(missing)} missing, e.g. {missing[:3].tolist()}; "
            f"{len(arr) - len(np.unique(arr))} repeated)"
        )
    return arr


def _coco_1k_from_similarity(
    views: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], ann: EccvAnnotations, config: RetrievalMetricConfig
) -> dict[str, dict[str, float]]:
    """Per fold, the fold's rows x columns (kept in matrix order, so ties break as in the full
    ranking restricted to the fold) scored like any similarity matrix; then the fold mean."""
    per_fold: dict[str, list[dict[str, float]]] = {m: [] for m in views}
    for f, fold in enumerate(ann.coco_1k_folds()):
        for modality, (matrix, row_ids, col_ids) in views.items():
            gallery = fold["t2i" if modality == "i2t" else "i2t"]
            rows = np.flatnonzero(np.isin(row_ids, np.fromiter(fold[modality], dtype=np.int64)))
            cols = np.flatnonzero(np.isin(col_ids, np.fromiter(gallery, dtype=np.int64)))
            sub = matrix[np.ix_(rows, cols)]
            try:
                scores = retrieval_scores_from_similarity(
                    sub, fold[modality], query_ids=row_ids[rows], gallery_ids=col_ids[cols], config=config
                )
            except RetrievalInputError as err:
                raise _in_context(f"coco_1k fold {f + 1}", modality, err) from None
            per_fold[modality].append(_named("coco_1k", scores))
    return {m: {key: float(np.mean([v[key] for v in folds])) for key in folds[0]} for m, folds in per_fold.items()}
