"""Per-class numbers: ODmAP@k per removed class (the metric module's `per_class_odmap` of the
ranking the trainer's `odmap_metrics` scores: `odmap_result`, the same embeddings, top-k and
class matrices) with its bar chart, and the units of every per-class metric (ODmAP@k and PN per
removed class).

A class's number is a function of the queries that removed it, not of the whole set: its units
are those queries only (`class_units`), so its record's `n_units` is the class's count, its
interval resamples them, and a resample always holds the class. Below `MIN_CLUSTERS` of their
clusters (source images, training/statistics.py) a class gets no interval and no test (n/a),
and its record's `ci_note` says why (statistics.intervals: one cluster, fewer than 6 clusters).
Its paired tests are a Holm family of their own (training/report/compare.py), apart from the
dataset table's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from counterfactory_metrics.odmap.odmap_scores import per_class_odmap, plot_per_class
from training.eval_data import EvalData
from training.evaluation import odmap_result
from training.statistics import MIN_CLUSTERS, UnitScores

TASK = "odmap_per_class"


def odmap_per_class(emb: dict[str, np.ndarray], data: EvalData, k_values) -> dict[str, dict[int, float]]:
    """class -> {k: ODmAP@k of the queries that removed it}."""
    return per_class_odmap(odmap_result(emb, data, k_values), data.removed)


def per_class_metrics(per_class: dict[str, dict[int, float]]) -> dict[str, float]:
    """As evaluate_model's `task/name` keys, so results.make_records groups them."""
    return {f"{TASK}/{c}_ODmAP@{k}": v for c, by_k in per_class.items() for k, v in by_k.items()}


def class_of(key: str) -> str | None:
    """The class of a per-class metric key (`odmap_per_class/dog_ODmAP@5`, `necessity/PN_dog`);
    None for any other key (PN_mean among them)."""
    task, _, name = key.partition("/")
    if task == TASK:
        return name.rpartition("_ODmAP@")[0]
    if task == "necessity" and name.startswith("PN_") and name != "PN_mean":
        return name.removeprefix("PN_")
    return None


def restrict(u: UnitScores, keep: np.ndarray, units: str) -> UnitScores:
    """`u` on the units `keep` selects, as a unit set named `units` (every per-unit array field
    is subset, whatever fields UnitScores has; `partners`, unit indices, renumbered, a partner
    left out becoming none)."""
    changes = {
        f.name: getattr(u, f.name)[keep]
        for f in dataclasses.fields(u)
        if isinstance(getattr(u, f.name), np.ndarray) and len(getattr(u, f.name)) == u.n
    }
    if u.partners is not None:
        kept = np.flatnonzero(keep) if np.asarray(keep).dtype == bool else np.asarray(keep)
        renumbered = np.full(u.n, -1)
        renumbered[kept] = np.arange(len(kept))
        changes["partners"] = np.where(changes["partners"] >= 0, renumbered[changes["partners"]], -1)
    return dataclasses.replace(u, units=units, **changes)


def class_units(units: dict[str, UnitScores]) -> dict[str, UnitScores]:
    """`units` with every per-class metric on its class's own units (those with a positive
    denominator: the queries that removed the class), and PN's mean on the queries with a PN
    value; the same values, each with its own n."""
    out = dict(units)
    for key, u in units.items():
        c = class_of(key)
        if c is not None and u.den is not None:
            out[key] = restrict(u, u.den > 0, f"{u.units} that removed {c}")
        elif key == "necessity/PN_mean" and u.den is not None:
            # Queries whose source image is not in the --coco split have no PN value: no unit.
            out[key] = restrict(u, u.den > 0, f"{u.units} with a value")
    return out


def testable(key: str, u: UnitScores) -> bool:
    """Whether a metric's units allow an interval and a test (per-class: `MIN_CLUSTERS` clusters,
    the fewest a sign-flip test, which swaps clusters, can reject at 0.05 with)."""
    return u.n > 0 and (class_of(key) is None or u.n_clusters >= MIN_CLUSTERS)


def plot(per_class: dict[str, dict[int, float]], path: Path, model: str) -> Path:
    # plot_per_class writes titles as plain text (no mathtext from a model or class name).
    return plot_per_class(per_class, path, title=f"ODmAP@k per removed class: {model}")
