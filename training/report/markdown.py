"""`report.md`: one table per model and, per dataset, a side-by-side comparison of the models with
the best value of each column in bold. Model, dataset and metric names come from the user and
the data, so they are written as plain text (Markdown and HTML escaped)."""

from __future__ import annotations

import html
import re

_MARKDOWN = re.compile(r"([\\`*_\[\]|~])")


def plain(text) -> str:
    """`text` shown literally in a Markdown table cell."""
    return _MARKDOWN.sub(r"\\\1", html.escape(str(text), quote=False)).replace("\n", " ")


def higher_is_better(metric: str) -> bool:
    # Recalls, ODmAP, ECCV / CxC / PMRP, mean/median score deltas and PN (the caption's score
    # falls when its object is removed: the model looks at the object) grow with a better model;
    # the fraction of pairs whose delta is below zero (it prefers the wrong image/caption) shrinks.
    return not metric.endswith("frac_below_zero")


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def rank_models(records: list[dict], dataset: str, task: str, metric: str) -> list[str]:
    """Models best first on one metric (models without a value left out)."""
    values = {r["model"]: r["metrics"].get(metric) for r in records
              if r["dataset"] == dataset and r["task"] == task}
    known = [(v, m) for m, v in values.items() if v is not None]
    known.sort(key=lambda vm: vm[0], reverse=higher_is_better(metric))
    return [m for _, m in known]


#: Too many columns for a side-by-side table (80 COCO classes x k): per model tables and charts.
PER_MODEL_ONLY = {"odmap_per_class"}


def _in_comparison(task: str, name: str) -> bool:
    # PN per removed class is as wide as ODmAP per class: the comparison shows its mean.
    return task not in PER_MODEL_ONLY and (task != "necessity" or name == "PN_mean")


def _columns(records: list[dict], dataset: str) -> list[tuple[str, str]]:
    cols = {(r["task"], name) for r in records if r["dataset"] == dataset for name in r["metrics"]
            if _in_comparison(r["task"], name)}
    return sorted(cols)


def model_table(records: list[dict], model: str) -> list[str]:
    lines = ["| dataset | task | metric | value |", "|---|---|---|---|"]
    for r in records:
        if r["model"] == model:
            lines += [f"| {plain(r['dataset'])} | {plain(r['task'])} | {plain(name)} | {_fmt(v)} |"
                      for name, v in sorted(r["metrics"].items())]
    return lines


def comparison_table(records: list[dict], dataset: str, models: list[str]) -> list[str]:
    cols = _columns(records, dataset)
    value = {(r["model"], r["task"], n): v for r in records if r["dataset"] == dataset
             for n, v in r["metrics"].items()}
    best = {}
    for task, name in cols:
        ranked = rank_models(records, dataset, task, name)
        if ranked:
            best[(task, name)] = value[(ranked[0], task, name)]
    lines = ["| model | " + " | ".join(plain(f"{t}/{n}") for t, n in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for model in models:
        cells = []
        for task, name in cols:
            v = value.get((model, task, name))
            cells.append(f"**{_fmt(v)}**" if v is not None and v == best.get((task, name)) and len(models) > 1
                         else _fmt(v))
        lines.append(f"| {plain(model)} | " + " | ".join(cells) + " |")
    return lines


def render_report(records: list[dict]) -> str:
    models = list(dict.fromkeys(r["model"] for r in records))
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    out = ["# Model report", "",
           "Every number is computed by the project's metric modules (counterfactory_metrics) "
           "through the trainer's evaluation (`--eval-only`); `results.jsonl` has each record "
           "with its model digest and dataset commit.", ""]
    out += ["## Comparison", "", "Best value of each column in bold (fraction below zero: lowest; "
            "every other metric: highest).", ""]
    for dataset in datasets:
        source = next(r["dataset_source"] for r in records if r["dataset"] == dataset)
        out += [f"### {plain(dataset)} ({plain(source)})", "", *comparison_table(records, dataset, models), ""]
    out += ["## Per model", ""]
    for model in models:
        digest = next(r["weights_digest"] for r in records if r["model"] == model)
        out += [f"### {plain(model)}", "", f"weights {plain(digest)}", ""]
        n = models.index(model)
        if any(r["task"] == "odmap_per_class" and r["model"] == model for r in records):
            out += [f"![ODmAP@k per removed class](odmap_per_class-model{n}.png)", ""]
        for dataset in dict.fromkeys(r["dataset"] for r in records if r["model"] == model and r["task"] == "itm"):
            out += [f"![ITM score deltas on {plain(dataset)}](itm_deltas-model{n}-{dataset}.png)", ""]
        out += [*model_table(records, model), ""]
    return "\n".join(out)
