"""`results.jsonl`: one record per model x dataset x task, in clip-benchmark's vocabulary
(`dataset`, `model`, `pretrained`, `task`, `metrics`, `language`; its task names and metric keys
where it has the metric: `zeroshot_retrieval` with `image_retrieval_recall@K` (text -> image,
our t2i) and `text_retrieval_recall@K` (image -> text, our i2t), `zeroshot_classification` with
`acc1`, `acc5`, `mean_per_class_recall`), so the two tools' outputs concatenate into one table.
Our own metrics keep our own tasks (`zeroshot_retrieval_1k`: the COCO 1K folds, `eccv`, `odmap`,
`odmap_per_class`, `itm`, `necessity`).

Each record also holds what someone else needs to trust and reproduce a number: per metric the
95 % interval (`ci_low`, `ci_high`) over `n_units` units (those that enter the value: a class's
own queries) in `n_clusters` clusters (source images; the units where there are none), made by
`ci_method` (clopper-pearson, studentized, dyadic-t or percentile, training/statistics.py) from
`bootstrap` resamples and `seed` (null where a metric has no per-unit form, training/unit_scores.py; where
there is none, `ci_method` is `none` and `ci_note` says why: `fixed by construction` where
`trivial` is true, a value the units cannot move, e.g. R@K with K >= the gallery; `all n units
equal`, a sample without spread, which is no evidence the population has none; `one cluster`;
`fewer than 6 clusters`, too few for a bootstrap: training/statistics.py's MIN_CLUSTERS),
the weights digest, the dataset commit, the metric module's own file digest (`metric_version`) and the code
version (git commit + dirty flag, or version + installed-files digest:
`builders.engine.provenance.code_version`)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from builders.engine.provenance import code_version, model_name, source_digest
from counterfactory_metrics.itm_score_deltas.deltas import PAIR_SEED
from training.statistics import Interval
from training.unit_scores import RETRIEVAL

#: A record's per-metric fields (name -> value), beside `metrics` itself.
INTERVAL_FIELDS = (
    "metrics",
    "ci_low",
    "ci_high",
    "n_units",
    "n_clusters",
    "ci_method",
    "trivial",
    "ci_note",
    "chance",
)

#: record task -> the code computing it (digested as `metric_version`): a metric module of
#: counterfactory_metrics, or training.necessity for PN (no module: two datasets' scores).
METRIC_MODULES = {
    "zeroshot_retrieval": "counterfactory_metrics.map_at_r",
    "zeroshot_retrieval_1k": "counterfactory_metrics.map_at_r",
    "eccv": "counterfactory_metrics.map_at_r",
    "odmap": "counterfactory_metrics.odmap",
    "odmap_per_class": "counterfactory_metrics.odmap",
    "itm": "counterfactory_metrics.itm_score_deltas",
    "necessity": "training.necessity",
    "zeroshot_classification": "training.zeroshot",
    "blind_baseline": "training.report.floors",
}
#: Every module a cached number depends on (training/report/cache.py's key), the evaluation
#: sets' loaders (training/eval_data.py) among them.
EVALUATION_MODULES = tuple(
    sorted(
        {*METRIC_MODULES.values(), "training.evaluation", "training.eval_data", "training.unit_scores"}
        - {"training.report.floors"}
    )
)
#: The tasks whose numbers come from a ranking: a cross-encoder's records of them carry its
#: `retrieval` (method, k, first stage).
RANKED_TASKS = ("zeroshot_retrieval", "zeroshot_retrieval_1k", "eccv", "odmap", "odmap_per_class")
#: record task -> (the record field naming the score its numbers are made of, the task and that
#: score as the report names them): the ITM deltas' G, PN's s (training/evaluation.py). Models
#: whose scores differ are not compared on that task (training/report/run.py `_same_g`).
SCORE_KINDS = {"itm": ("g_kind", "ITM deltas", "G"), "necessity": ("s_kind", "PN", "s")}
#: Our datasets' captions are English (COCO's).
LANGUAGE = "en"
_RECALL = re.compile(r"(text|image)_retrieval_recall@\d+")
_ZEROSHOT = {"top1": "acc1", "top5": "acc5", "mean_per_class_recall": "mean_per_class_recall"}


def record_name(key: str) -> tuple[str, str] | None:
    """(record task, metric name) of one of training.evaluation's `task/name` keys, or None for a
    key that is no record's (the validation loss). The evaluation names R@K as the records do
    (training.unit_scores.recall_name); Flickr30k's is clip-benchmark's `zeroshot_retrieval`."""
    task, _, name = key.partition("/")
    if not name:
        return None
    if task == "flickr30k" and _RECALL.fullmatch(name):
        return RETRIEVAL, name
    if task == "zeroshot":
        _, _, stat = name.rpartition("/")
        return "zeroshot_classification", _ZEROSHOT.get(stat, stat)
    return task, name


def metric_version(task: str) -> str:
    """The file digest of the module computing `task` (a bug fix there changes it)."""
    return source_digest(METRIC_MODULES.get(task, "training.evaluation"))


def _finite(value: float | None) -> float | None:
    # JSON has no NaN (e.g. ITM statistics of an empty group): written as null.
    return None if value is None or math.isnan(value) else float(value)


def make_records(
    spec,
    digest: str | None,
    dataset,
    metrics: dict[str, float],
    intervals: dict[str, Interval],
    bootstrap: int,
    seed: int,
    chance: dict[str, float] | None = None,
    kind: str | None = None,
    retrieval: dict | None = None,
) -> list[dict]:
    """The records of one model on one dataset: `metrics` (training.evaluation's `task/name`
    keys) grouped by record task, with each one's interval (`intervals`: key ->
    `training.statistics.Interval`; none with `bootstrap` 0) and chance level (`chance`,
    training/report/floors.py); the ITM record's G or the PN one's s (`kind`); a cross-encoder's
    ranked tasks (`RANKED_TASKS`) say how it ranked (`retrieval`: method, k, first stage)."""
    by_task: dict[str, dict[str, dict]] = {}
    chance = chance or {}
    for key, value in metrics.items():
        named = record_name(key)
        if named is None:
            continue
        task, name = named
        fields = by_task.setdefault(task, {k: {} for k in INTERVAL_FIELDS})
        if key in chance:
            fields["chance"][name] = _finite(chance[key])
        found = intervals.get(key)
        fields["metrics"][name] = _finite(value)
        fields["ci_low"][name] = _finite(found.low) if found else None
        fields["ci_high"][name] = _finite(found.high) if found else None
        fields["n_units"][name] = found.n if found else None
        fields["n_clusters"][name] = found.n_clusters if found else None
        fields["ci_method"][name] = found.method if found else None
        fields["trivial"][name] = found.trivial if found else None
        fields["ci_note"][name] = found.note if found else None
    # A local folder is named by its contents (local:NAME@sha256:...), never by a path of this
    # machine, as builds and training runs name it.
    model = model_name(spec.name)
    return [
        {
            "dataset": dataset.name,
            "model": model,
            "pretrained": spec.pretrained or model,
            "backend": spec.backend,
            "weights_digest": digest,
            "task": task,
            "language": LANGUAGE,
            **fields,
            "bootstrap": bootstrap,
            "seed": seed,
            **dataset.provenance(),
            **_score_fields(task, fields["metrics"], kind),
            **({"retrieval": retrieval} if retrieval and task in RANKED_TASKS else {}),
            "metric": METRIC_MODULES.get(task, "training.evaluation"),
            "metric_version": metric_version(task),
            "code_version": code_version(),
        }
        for task, fields in sorted(by_task.items())
    ]


def _score_fields(task: str, metrics: dict, kind: str | None) -> dict:
    """An ITM record's G (`g_kind`) and, with real-pair deltas, the seed of their partners; a PN
    record's s (`s_kind`)."""
    if task not in SCORE_KINDS:
        return {}
    real = task == "itm" and any(n.endswith("_r") or "_r_" in n for n in metrics)
    return {**({SCORE_KINDS[task][0]: kind} if kind else {}), **({"pair_seed": PAIR_SEED} if real else {})}


def write_results(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True, allow_nan=False) + "\n" for r in records))


def read_results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
