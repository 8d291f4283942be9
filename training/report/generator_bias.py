"""How much a model's ITM score deltas depend on the generator that drew the images (issue #37 §2).

A renderings dataset (one caption-pair table rendered by several generators, one config each)
given as `--counterfactuals` is scored as one dataset per generator, `counterfactuals/G`
(training/report/datasets.py): its records, comparisons between models, floors and plots are
those of a build of G's rows alone. On top, the generator-bias table: on the pairs EVERY
generator kept (the intersection of their pair ids), for each model and each ITM metric with
per-pair units, value(G) - value(H) for every two generators G before H in the dataset's order,
its 95 % paired bootstrap interval and the paired test's p-value, Holm-adjusted across the whole table
(every model, metric and pair of generators), computed by compare.py's `compare_dataset` as it
compares two models: the generators take the models' place, on the same pairs with the same
resamples. A pair one generator dropped (its CLIP filters found no good image) is left out of
every difference: on different pairs a difference would measure the pairs, not the generators.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from builders.engine.provenance import source_digest
from training.report.compare import Comparison, compare_dataset, comparison_cells
from training.report.markdown import _fmt, cell, natural, plain
from training.statistics import MIN_CLUSTERS, UnitScores, first_seen, holm

#: The record task of a generator-bias record (one per model x pair of generators).
TASK = "generator_bias"
#: Its code: the paired statistics (the differences themselves are compare.py's).
MODULE = "training.statistics"
#: The units of the ITM metrics `compare_dataset` pairs (training/unit_scores.py's name).
PAIR_UNITS = "counterfactual pairs"


@dataclass
class GeneratorBias:
    """The generators of a renderings dataset in its order, the pairs each kept, the common pairs,
    and (model, comparison) of every test (`Comparison.model`/`.other`: the generators G and H)."""

    generators: list[str]
    kept: dict[str, int]
    common: int = 0
    #: G -> pairs another generator kept and G did not (each is left out of the table).
    dropped: dict[str, int] = field(default_factory=dict)
    comparisons: list[tuple[str, Comparison]] = field(default_factory=list)


def common_rows(ids: dict[str, list[str]]) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Per generator, the rows (unit indices) of the pairs every generator kept, all in the first
    generator's order; and per generator the pairs of the others' it did not keep."""
    kept = {g: set(v) for g, v in ids.items()}
    every = set().union(*kept.values()) if kept else set()
    first = next(iter(ids.values()), [])
    common = [p for p in first if all(p in k for k in kept.values())]
    rows = {}
    for g, v in ids.items():
        at = {p: n for n, p in enumerate(v)}
        rows[g] = np.fromiter((at[p] for p in common), np.int64, len(common))
    return rows, {g: len(every - k) for g, k in kept.items()}


def on_rows(u: UnitScores, rows: np.ndarray) -> UnitScores:
    """`u` on the units `rows` only, named as the common pairs (so every generator's metric
    on them shares each resample and swap)."""
    return replace(
        u,
        units=f"common {u.units}",
        num=u.num[rows],
        den=None if u.den is None else u.den[rows],
        groups=None if u.groups is None else u.groups[rows],
        clusters=None if u.clusters is None else first_seen(u.clusters[rows]),
    )


def generator_bias(
    ids: dict[str, list[str]],
    units: dict[str, dict[str, dict[str, UnitScores]]],
    models: list[str],
    resamples: int,
    seed: int,
) -> GeneratorBias:
    """The table of the generators `ids` (G -> its pair ids, in the dataset's order); `units`:
    G -> model -> evaluation key -> UnitScores on G's pairs (in `ids[G]`'s order)."""
    rows, dropped = common_rows(ids)
    kept = {g: len(v) for g, v in ids.items()}
    common = len(next(iter(rows.values()), []))
    bias = GeneratorBias(list(ids), kept, common, dropped)
    if len(ids) < 2 or not common:
        return bias
    for model in models:
        on_common = {
            g: {
                key: on_rows(u, rows[g])
                for key, u in units.get(g, {}).get(model, {}).items()
                if key.startswith("itm/") and u.units == PAIR_UNITS
            }
            for g in ids
        }
        tests = compare_dataset("counterfactuals", on_common, list(ids), resamples, seed)
        bias.comparisons += [(model, c) for c in tests]
    # One family: every model, metric and pair of generators of the table.
    for (_, c), p in zip(bias.comparisons, holm([c.p_value for _, c in bias.comparisons]), strict=True):
        c.p_holm = float(p)
    return bias


def bias_records(bias: GeneratorBias, records: list[dict]) -> list[dict]:
    """One record per model x pair of generators (task `generator_bias`, `generator` G and
    `other_generator` H): per metric the difference value(G) - value(H) in `metrics`, its interval,
    the p-values and the common pairs (`n_units`); provenance from the model's ITM record on G."""
    itm = {(r["model"], r.get("generator")): r for r in records if r["task"] == "itm" and r.get("generator")}
    grouped: dict[tuple[str, str, str], list[Comparison]] = {}
    for model, c in bias.comparisons:
        grouped.setdefault((model, c.model, c.other), []).append(c)
    out = []
    for (model, g, h), tests in grouped.items():
        base = itm[(model, g)]
        per_metric = {name: {c.metric: c.as_dict()[attr] for c in tests} for name, attr in _FIELDS.items()}
        out.append(
            {
                **{k: base[k] for k in ("model", "pretrained", "backend", "weights_digest", "language")},
                "dataset": base["dataset"].partition("/")[0],
                "task": TASK,
                "generator": g,
                "other_generator": h,
                **per_metric,
                "n_units": {c.metric: bias.common for c in tests},
                "pairs_kept": bias.kept,
                "pairs_dropped": bias.dropped,
                **{k: base[k] for k in ("bootstrap", "seed", "dataset_source", "dataset_revision", "dataset_commit")},
                "metric": MODULE,
                "metric_version": source_digest(MODULE),
                "code_version": base["code_version"],
            }
        )
    return out


#: A generator-bias record's field -> the Comparison attribute it holds per metric.
_FIELDS = {"metrics": "difference", "ci_low": "low", "ci_high": "high", "p_value": "p_value", "p_holm": "p_holm"}

PER_GENERATOR_MEANING = (
    "The ITM score deltas of each model on each generator's rendering of the caption-pair table, "
    "each on the pairs that generator kept (`value [low, high]`: the 95 % bootstrap interval over "
    "them); the chance level is a model without preference. Each generator's comparison of the "
    "models, floors and plots are in its `counterfactuals/G` section above."
)


def per_generator_table(records: list[dict], generators: list[str], kept: dict[str, int]) -> list[str]:
    """Rows model x generator, a column per ITM metric, and the chance level row."""
    rows = [r for r in records if r["task"] == "itm" and r.get("generator") in generators]
    cols = sorted({n for r in rows for n in r["metrics"]}, key=natural)
    lines = [
        "| model | generator | pairs | " + " | ".join(plain(f"itm/{n}") for n in cols) + " |",
        "|---|---|---|" + "---|" * len(cols),
    ]
    for model in dict.fromkeys(r["model"] for r in rows):
        for g in generators:
            r = next((r for r in rows if r["model"] == model and r["generator"] == g), None)
            cells = [cell(r, n) if r else "n/a" for n in cols]
            lines.append(f"| {plain(model)} | {plain(g)} | {kept.get(g, 0):,} | " + " | ".join(cells) + " |")
    chance = {n: v for r in rows for n, v in (r.get("chance") or {}).items()}
    if chance:
        lines.append(
            "| *chance level* | | | " + " | ".join(_fmt(chance.get(n)) if n in chance else "-" for n in cols) + " |"
        )
    return lines


def bias_lines(bias: GeneratorBias) -> list[str]:
    """The "Generator bias" section's text and table (one line when there is nothing to pair)."""
    kept = ", ".join(f"{plain(g)} {n:,}" for g, n in bias.kept.items())
    if len(bias.generators) < 2:
        return [f"One generator ({kept} pairs): no generator to compare it with."]
    if not bias.common:
        return [f"No pair was kept by every generator (pairs kept: {kept}): no paired differences."]
    dropped = ", ".join(f"{plain(g)} {n:,}" for g, n in bias.dropped.items())
    lines = [
        f"On the {bias.common:,} pairs every generator kept (pairs kept: {kept}; left out, kept by "
        f"another generator but not by this one: {dropped}), each model's value(generator) - "
        "value(vs) on the same pairs: the difference, its 95 % paired bootstrap interval (the same "
        "resamples of the common pairs for both generators, unadjusted) and the p-value of the "
        "paired test (a mean's: the bootstrap-t; a median's: the sign-flip permutation test; none "
        f"below {MIN_CLUSTERS} pairs), Holm-corrected across this table ({len(bias.comparisons)} tests). No bias is a "
        "difference of 0; the captions of a pair are the same for every generator, so a "
        "difference comes from the images.",
        "",
        "| model | metric | generator | vs | difference [95 % CI] | test | p | p (Holm) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, c in bias.comparisons:
        lines.append(
            f"| {plain(model)} | {plain(c.task + '/' + c.metric)} | {plain(c.model)} | {plain(c.other)} | "
            f"{comparison_cells(c)} |"
        )
    return lines


def generator_lines(records: list[dict], bias: GeneratorBias) -> list[str]:
    """report.md's "Per generator" and "Generator bias" sections."""
    return [
        "## Per generator",
        "",
        PER_GENERATOR_MEANING,
        "",
        *per_generator_table(records, bias.generators, bias.kept),
        "",
        "## Generator bias",
        "",
        *bias_lines(bias),
        "",
    ]
