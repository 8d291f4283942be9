"""Per-unit scores of the evaluation's metrics (`training.statistics.UnitScores`), computed from
the embeddings the evaluation encoded: the units the intervals and the paired tests resample.

- retrieval (COCO, Flickr30k): images, each with all its captions. i2t R@K
  (`text_retrieval_recall@K`, clip_benchmark's key) is the fraction of images whose top K holds
  one of their captions; t2i R@K (`image_retrieval_recall@K`) counts each image's captions found
  at rank <= K over its caption count; the COCO 1K numbers (`zeroshot_retrieval_1k/...`) are the
  mean over the folds (groups).
- ODmAP@k (and per removed class): queries, each with its AP@k.
- ITM deltas: pairs (the held-out counterfactual pairs; for IR_r/TR_r the real images, each
  with its random partner), the mean, the median and the fraction below zero of the deltas.
  A real pair's unit also uses its partner's image (IR_r) or caption (TR_r), unit r(i)'s own;
  the derangement's cycles are too few to be clusters, so the real pairs are resampled as
  units, each carrying its partner (`UnitScores.partners`, `real_partners`), and their mean's
  interval and paired test take the dyadic standard error of linked units
  (statistics.robust_se; coverage in benchmarks/report_coverage.py and docs/report.md).
- PN: removal pairs (queries), each with the sum and count of its (caption, class) values.
- zero-shot: test images, top-1 / top-5 hits and per-class recall (classes as groups).

Units made from one COCO source image are one cluster (`UnitScores.clusters`), resampled and
swapped together: the counterfactual pairs by their `source_image_id` (`pair_clusters`; a pair
without one is its own), the decorrelation queries (ODmAP, PN) by their source `image_id`. R@K,
the fraction below zero and top-1/top-5 are proportions (Clopper-Pearson intervals); R@K with K
at least the gallery's size is a hit by construction (`trivial`).

training/evaluation.py's `unit_scores(emb, data, k_values)` gives them under the evaluation's
metric names; a metric with no per-unit form (the ECCV Caption suite, the validation loss) has
none and no interval. This module imports nothing of evaluation.py (no import circle).
"""

from __future__ import annotations

import numpy as np

from counterfactory_metrics.itm_score_deltas.deltas import PAIR_SEED, itm_deltas, random_derangement
from counterfactory_metrics.map_at_r.retrieval import RetrievalMetricConfig, retrieval_scores_from_similarity
from training.ranked_scores import direction_scores
from training.statistics import UnitScores, first_seen


#: The whole split's R@K task, as clip_benchmark and `counterfactory benchmark` name it.
RETRIEVAL = "zeroshot_retrieval"


def recall_name(direction: str, k: int) -> str:
    """clip_benchmark's key of R@K: `text_retrieval_recall@K` (image -> text, i2t) or
    `image_retrieval_recall@K` (text -> image, t2i); the trainer and the report share it."""
    return f"{'text' if direction == 'i2t' else 'image'}_retrieval_recall@{k}"


def retrieval_units(
    emb: dict[str, np.ndarray], data, k_values, name: str = RETRIEVAL, units: str = "coco images"
) -> dict[str, UnitScores]:
    """R@K both ways (`recall_name`) on the whole split (`name/...`) and, when `data.folds` has
    them, on the COCO 1K folds (`name_1k/...`), per image.

    Ties: equal captions (equal images) get equal scores by construction (`ranked_scores.tied_scores`), and
    equal scores rank by the gallery's id, ascending (caption id for image -> text, image id for
    text -> image), so R@K depends neither on float noise nor on the order of the captions."""
    img_order = np.argsort(data.image_ids, kind="stable")
    cap_order = np.argsort(data.caption_ids, kind="stable")
    captions = [data.captions[c] for c in cap_order] if len(data.captions) == len(cap_order) else []
    # Images and captions in id order (the tie order); the units keep the data's image rows.
    i2t, t2i = direction_scores(emb, img_order, cap_order, captions)
    all_image_ids, all_caption_ids = data.image_ids[img_order], data.caption_ids[cap_order]
    all_caption_image = data.caption_image[cap_order]
    position = np.empty_like(img_order)
    position[img_order] = np.arange(len(img_order))
    cfg = RetrievalMetricConfig(k_values=tuple(k_values), map_at_r=False, r_precision=False)
    row_of = {int(i): r for r, i in enumerate(data.image_ids)}
    n = len(data.image_ids)
    # metric -> per-unit numerator, denominator and fold (-1: in no fold; the whole split: None)
    parts: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
    beaten: set[str] = set()  # R@K with K below some gallery's size: not a hit by construction
    for fold, fold_rows in enumerate([np.arange(n), *data.folds]):
        key = name if fold == 0 else f"{name}_1k"
        at = np.sort(position[fold_rows])  # the fold's images, by id
        rows, image_ids = img_order[at], all_image_ids[at]
        cols = np.flatnonzero(np.isin(all_caption_image, image_ids))
        cap_ids, cap_image = all_caption_ids[cols], all_caption_image[cols]
        order = np.argsort(cap_image, kind="stable")
        owners, starts = np.unique(cap_image[order], return_index=True)
        by_image = dict(zip(owners.tolist(), (g.tolist() for g in np.split(cap_ids[order], starts[1:])), strict=True))
        i2t_pos = {int(i): by_image.get(int(i), []) for i in image_ids}
        t2i_pos = {int(c): [int(i)] for c, i in zip(cap_ids, cap_image, strict=True)}
        caption_rows = np.fromiter((row_of[int(i)] for i in cap_image), np.int64, len(cap_image))
        for direction, matrix, pos, q, g in (
            ("i2t", i2t if fold == 0 else i2t[np.ix_(at, cols)], i2t_pos, image_ids, cap_ids),
            ("t2i", (t2i if fold == 0 else t2i[np.ix_(at, cols)]).T, t2i_pos, cap_ids, image_ids),
        ):
            scores = retrieval_scores_from_similarity(matrix, pos, q, g, cfg)
            for k in k_values:
                hits = scores.per_query[f"recall_at_{k}"]
                num, den, groups = parts.setdefault(
                    f"{key}/{recall_name(direction, k)}", (np.zeros(n), np.zeros(n), np.full(n, -1) if fold else None)
                )
                if k < len(g):
                    beaten.add(f"{key}/{recall_name(direction, k)}")
                if direction == "i2t":
                    num[rows], den[rows] = hits, 1.0
                else:  # per caption: summed over each caption's image
                    num += np.bincount(caption_rows, weights=hits, minlength=n)
                    den += np.bincount(caption_rows, minlength=n)
                if groups is not None:
                    groups[rows] = fold
    return {
        metric: UnitScores(units, *arrays, proportion=True, trivial=metric not in beaten)
        for metric, arrays in parts.items()
    }


def pair_clusters(pairs) -> np.ndarray | None:
    """The cluster of each counterfactual pair (`EvalData.cf_pairs`, two rows a pair): its
    `source_image_id`; a pair without one (or a build without the column) is its own."""
    if pairs is None or not len(pairs):
        return None
    from training.sources import column_values  # datasets, loaded with the tables: not on import

    columns: dict[int, list] = {}  # table -> its source_image_id column (read once, no images)
    ids: list[str] = []
    for k in range(0, len(pairs), 2):
        t = pairs.table_of[k]
        if t not in columns:
            table = pairs.tables[t]
            has = "source_image_id" in table.column_names
            columns[t] = column_values(table, "source_image_id") if has else []
        found = columns[t][pairs.row[k]] if columns[t] else None
        ids.append(f"source:{found}" if found not in (None, "") else f"pair:{k // 2}")
    return first_seen(ids)


def odmap_units(result, removed: list[list[str]], clusters: np.ndarray | None = None) -> dict[str, UnitScores]:
    """ODmAP@k and ODmAP@k per removed class, per query, from the odmap module's result;
    `clusters`: each query's source image."""
    odmap = {"clusters": clusters, "bounds": (0, 1)}  # AP@k lies in [0, 1]
    out = {
        f"odmap/ODmAP@{k}": UnitScores("decorrelation queries", np.asarray(ap, np.float64), **odmap)
        for k, ap in result.per_query.items()
    }
    for c in sorted({c for r in removed for c in r}):
        has = np.asarray([c in r for r in removed], dtype=np.float64)
        out.update(
            {
                f"odmap_per_class/{c}_ODmAP@{k}": UnitScores("decorrelation queries", ap * has, has, **odmap)
                for k, ap in result.per_query.items()
            }
        )
    return out


def real_partners(n: int) -> np.ndarray:
    """Each of n real pairs' random partner r(i) (evaluation.py's `itm_inputs`): the metric
    module's seeded derangement, the same for every model."""
    return random_derangement(n, PAIR_SEED)


def delta_units(scores: dict[str, np.ndarray], clusters: np.ndarray | None = None) -> dict[str, UnitScores]:
    """mean, median and fraction below zero of each ITM delta, per pair (`itm_inputs` scores);
    `clusters`: the counterfactual pairs' (`pair_clusters`; a real pair is its own unit, linked
    to its partner's unit by `partners`)."""
    out = {}
    for delta, values in itm_deltas(**scores).items():
        real = delta.endswith("_r")
        units, mine = ("real pairs", None) if real else ("counterfactual pairs", clusters)
        partners = real_partners(len(values)) if real else None
        out.update(
            {
                f"itm/{delta}_mean": UnitScores(units, values, clusters=mine, partners=partners),
                f"itm/{delta}_median": UnitScores(units, values, median=True, clusters=mine, partners=partners),
                f"itm/{delta}_frac_below_zero": UnitScores(
                    units, (values < 0).astype(np.float64), clusters=mine, proportion=True, partners=partners
                ),
            }
        )
    return out


def necessity_units(
    values: list[tuple[int, str, float]], queries: int, clusters: np.ndarray | None = None
) -> dict[str, UnitScores]:
    """PN per removed class and its mean from `(query, class, PN)` values, per removal pair;
    `clusters`: each query's source image."""
    if not values:
        return {}
    q, pn = np.asarray([v[0] for v in values]), np.asarray([v[2] for v in values])
    kinds = {f"PN_{c}": np.asarray([v[1] == c for v in values]) for c in sorted({v[1] for v in values})}
    return {
        f"necessity/{name}": UnitScores(
            "removal pairs",
            np.bincount(q[mine], pn[mine], queries),
            np.bincount(q[mine], minlength=queries).astype(np.float64),
            clusters=clusters,
        )
        for name, mine in {**kinds, "PN_mean": np.ones(len(values), bool)}.items()
    }


def zeroshot_units(name: str, images: np.ndarray, classes: np.ndarray, labels: np.ndarray) -> dict[str, UnitScores]:
    """Top-1 / top-5 hits and per-class recall of one zero-shot set, per test image."""
    logits = images @ classes.T
    k = min(5, logits.shape[1])
    top = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    hit1 = (top[:, 0] == labels).astype(np.float64)
    units = f"{name} test images"
    return {
        f"zeroshot/{name}/top1": UnitScores(units, hit1, proportion=True),
        f"zeroshot/{name}/top{k}": UnitScores(
            units, (top == labels[:, None]).any(1).astype(np.float64), proportion=True, trivial=k >= logits.shape[1]
        ),
        f"zeroshot/{name}/mean_per_class_recall": UnitScores(units, hit1, groups=labels),
    }
