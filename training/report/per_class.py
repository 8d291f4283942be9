"""ODmAP@k per removed class: the metric module's `per_class_odmap` of the ranking the trainer's
`odmap_metrics` scores (`odmap_result`: the same embeddings, top-k and class matrices), and its
bar chart."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from counterfactory_metrics.odmap.odmap_scores import per_class_odmap, plot_per_class
from training.eval_data import EvalData
from training.evaluation import odmap_result

TASK = "odmap_per_class"


def odmap_per_class(emb: dict[str, np.ndarray], data: EvalData, k_values) -> dict[str, dict[int, float]]:
    """class -> {k: ODmAP@k of the queries that removed it}."""
    return per_class_odmap(odmap_result(emb, data, k_values), data.removed)


def per_class_metrics(per_class: dict[str, dict[int, float]]) -> dict[str, float]:
    """As evaluate_model's `task/name` keys, so results.make_records groups them."""
    return {f"{TASK}/{c}_ODmAP@{k}": v for c, by_k in per_class.items() for k, v in by_k.items()}


def plot(per_class: dict[str, dict[int, float]], path: Path, model: str) -> Path:
    # plot_per_class writes titles as plain text (no mathtext from a model or class name).
    return plot_per_class(per_class, path, title=f"ODmAP@k per removed class: {model}")
