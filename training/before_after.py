"""The cost of finetuning: the base model evaluated before step 1, on every configured
evaluation (retrieval, zero-shot, Flickr30k, ODmAP@k, ITM deltas, PN), and the final model
against it.

`evaluate_base` runs once per run folder (a resumed run finds its metrics in `before.json`) and
saves the base model's embeddings to `embeddings_before.npz`, so the finish can compare the two
models on the same units without encoding the base model again:
`before_after` gives per metric the value before, after, the difference and its 95 % paired
bootstrap interval (the same resamples of the same units for both models,
training/statistics.py), which metrics.md, run.json (`before_after`) and the model card show.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np

from training.statistics import UnitScores, bootstrap, difference_interval, intervals, paired_intervals
from training.evaluation import unit_scores
from training.run_root import RunRoot

log = logging.getLogger(__name__)

BEFORE_EMBEDDINGS = "embeddings_before.npz"
BEFORE_METRICS = "before.json"


def read_before(output: Path) -> dict[str, float] | None:
    """The base model's metrics of this run folder (None: not evaluated yet)."""
    path = output / BEFORE_METRICS
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    return saved if isinstance(saved, dict) else None


def write_before(root: RunRoot, metrics: dict[str, float]) -> None:
    root.write_text(BEFORE_METRICS, json.dumps(metrics))


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


def before_after(
    output: Path,
    data,
    k_values,
    final: dict[str, float],
    final_units: dict[str, UnitScores],
    resamples: int,
    seed: int,
) -> dict[str, dict]:
    """metric -> {before, after, difference, ci_low, ci_high} of every final metric the base
    model was evaluated on (the interval: None without units, embeddings or resamples)."""
    before = read_before(output)
    if before is None:
        return {}
    units: dict[str, UnitScores] = {}
    saved = output / BEFORE_EMBEDDINGS
    if resamples and saved.is_file():
        units = unit_scores(_load(saved), data, k_values)
    pairs = {
        k: (units[k], final_units[k]) for k in units.keys() & final_units.keys() if units[k].n == final_units[k].n
    }
    resampled = (
        bootstrap({(k, side): pair[i] for k, pair in pairs.items() for i, side in enumerate("ba")}, resamples, seed)
        if pairs
        else {}
    )
    # As the report's paired differences (training/report/compare.py): studentized where the
    # difference is linear in the units, else the percentile interval of the resampled ones.
    studentized = paired_intervals({k: (a, b) for k, (b, a) in pairs.items()}, resamples, seed)
    out = {}
    for key, after in final.items():
        if key not in before:
            continue
        row = {
            "before": before[key],
            "after": after,
            "difference": after - before[key],
            "ci_low": None,
            "ci_high": None,
            "ci_note": None,  # why a difference with units has no interval (all units equal, ...)
        }
        if key in pairs:
            low, high = difference_interval(studentized[key], resampled[(key, "a")] - resampled[(key, "b")])
            row.update(ci_low=None if math.isnan(low) else low, ci_high=None if math.isnan(high) else high)
            row["ci_note"] = studentized[key].note
        out[key] = row
    return out


def before_after_table(rows: dict[str, dict], overlap: dict[str, dict] | None = None) -> str:
    """The Markdown table of metrics.md and the model card (metric names are data: plain text),
    the metrics of a set that overlaps training marked as in the final table."""
    from training.leakage import mark_overlapping
    from training.report.markdown import _fmt, natural, plain, with_interval

    if not rows:
        return ""
    rows = mark_overlapping(rows, overlap or {})
    lines = ["| metric | before (base model) | after | difference [95 % CI] |", "|---|---|---|---|"]
    for key in sorted(rows, key=natural):
        r = rows[key]
        change = with_interval(r["difference"], r["ci_low"], r["ci_high"], r.get("ci_note"))
        lines.append(f"| {plain(key)} | {_fmt(r['before'])} | {_fmt(r['after'])} | {change} |")
    return "\n".join(lines) + "\n"


def final_statistics(
    output: Path, data, cfg, metrics: dict[str, float], units: dict[str, UnitScores], trained: bool = True
) -> dict:
    """run.json's `final_intervals` (metric -> [low, high]), `final_interval_notes` (metric ->
    why it has none), `bootstrap`, `bootstrap_seed`, `before_metrics` (None: --eval-only or a run
    started before it was evaluated) and `before_after` (a run that `trained`; not --eval-only),
    with --bootstrap resamples seeded by --seed. Each interval is made as the report makes it
    (training.statistics.intervals: exact for proportions, studentized for means); a metric the
    units cannot move (fixed by construction, e.g. R@K with K >= the gallery), whose units all
    have the same value (no spread in the sample, which is not none in the population), of
    one cluster or of fewer than 6 (statistics.MIN_CLUSTERS) gets none, and its note says which."""
    resamples, seed = cfg.run.bootstrap, cfg.run.seed
    found = intervals({k: u for k, u in units.items() if k in metrics}, resamples, seed) if resamples else {}
    return {
        "final_intervals": {k: [i.low, i.high] for k, i in found.items() if np.isfinite([i.low, i.high]).all()},
        "final_interval_notes": {k: i.note for k, i in found.items() if i.note},
        "bootstrap": resamples,
        "bootstrap_seed": seed,
        "before_metrics": read_before(output) if trained else None,
        "before_after": before_after(output, data, cfg.run.k_values, metrics, units, resamples, seed)
        if trained
        else {},
    }
