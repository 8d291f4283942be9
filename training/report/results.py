"""`results.jsonl`: one record per model x dataset x metric module, with field names of
clip-benchmark's result JSON (`dataset`, `model`, `pretrained`, `task`, `metrics`) so the two can
be merged, and what someone else needs to reproduce a number (weights digest, dataset commit,
metric and code versions)."""

from __future__ import annotations

import functools
import json
import math
from importlib import metadata
from pathlib import Path

from builders.engine.provenance import model_name

#: task (the prefix of training.evaluation's metric names) -> the code computing it: a metric
#: module of counterfactory_metrics, or training.evaluation for PN (no module: two datasets' embeddings).
METRIC_MODULES = {"retrieval": "counterfactory_metrics.map_at_r", "retrieval_1k": "counterfactory_metrics.map_at_r",
                  "eccv": "counterfactory_metrics.map_at_r", "odmap": "counterfactory_metrics.odmap",
                  "odmap_per_class": "counterfactory_metrics.odmap",
                  "itm": "counterfactory_metrics.itm_score_deltas", "necessity": "training.evaluation.necessity"}


@functools.cache
def code_version() -> str:
    """The installed counterfactory distribution, which also ships counterfactory_metrics."""
    try:
        return metadata.version("counterfactory")
    except metadata.PackageNotFoundError:
        return "unknown"


def _finite(value: float) -> float | None:
    # JSON has no NaN (e.g. ITM statistics of an empty group): written as null.
    return None if value is None or math.isnan(value) else float(value)


def make_records(spec, digest: str, dataset, metrics: dict[str, float]) -> list[dict]:
    """The records of one model on one dataset: `metrics` (training.evaluation's `task/name`
    keys) grouped by task."""
    by_task: dict[str, dict[str, float | None]] = {}
    for key, value in metrics.items():
        task, _, name = key.partition("/")
        if name:
            by_task.setdefault(task, {})[name] = _finite(value)
    # A local folder is named by its contents (local:NAME@sha256:...), never by a path of this
    # machine, as builds and training runs name it.
    model = model_name(spec.name)
    return [{"dataset": dataset.name, "model": model, "pretrained": spec.pretrained,
             "backend": spec.backend, "weights_digest": digest, "task": task, "metrics": values,
             **dataset.provenance(),
             "metric": METRIC_MODULES.get(task, f"counterfactory_metrics.{task}"),
             "metric_version": code_version(), "code_version": code_version()}
            for task, values in sorted(by_task.items())]


def write_results(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True, allow_nan=False) + "\n" for r in records))


def read_results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
