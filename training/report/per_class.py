"""ODmAP@k per removed class: the metric module's `per_class_odmap` of the ranking the trainer's
`odmap_metrics` scores (same embeddings, top-k and class matrices), and its bar chart."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from counterfactory_metrics.map_at_r.topk import topk_from_embeddings
from counterfactory_metrics.odmap.odmap_scores import odmap_from_topk, per_class_odmap, plot_per_class
from training.evaluation import EvalData, class_matrix, odmap_classes

TASK = "odmap_per_class"


def odmap_per_class(emb: dict[str, np.ndarray], data: EvalData, k_values) -> dict[str, dict[int, float]]:
    """class -> {k: ODmAP@k of the queries that removed it}."""
    k = min(max(k_values), len(data.gallery_captions))
    top, _ = topk_from_embeddings(emb["query_image"], emb["gallery_text"], k)
    classes = odmap_classes(data)
    res = odmap_from_topk(top, class_matrix(data.gallery_mentions, classes),
                          class_matrix(data.removed, classes), class_matrix(data.present, classes),
                          k_values=[v for v in k_values if v <= k])
    return per_class_odmap(res, data.removed)


def per_class_metrics(per_class: dict[str, dict[int, float]]) -> dict[str, float]:
    """As evaluate_model's `task/name` keys, so results.make_records groups them."""
    return {f"{TASK}/{c}_ODmAP@{k}": v for c, by_k in per_class.items() for k, v in by_k.items()}


def plot(per_class: dict[str, dict[int, float]], path: Path, model: str) -> Path:
    # plot_per_class writes titles as plain text (no mathtext from a model or class name).
    return plot_per_class(per_class, path, title=f"ODmAP@k per removed class: {model}")
