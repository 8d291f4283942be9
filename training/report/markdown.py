"""`report.md`: one table per model and, per dataset, a side-by-side comparison of the models with
the best value of each column in bold. Model, dataset and metric names come from the user and
the data, so they are written as plain text (Markdown and HTML escaped)."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

from builders.engine.plain_text import one_line
from training.report.floors import prior_effect
from training.statistics import FEW_CLUSTERS, MIN_CLUSTERS

_MARKDOWN = re.compile(r"([\\`*_\[\]|~])")
#: The task of the blind text-only baseline's records (training/report/floors.py).
BLIND = "blind_baseline"
#: A number from fewer independent units (clusters where the units have them) is marked a small
#: sample: its interval may under-cover and its test has little power (docs/report.md).
SMALL_SAMPLE = 30


def plain(text) -> str:
    """`text` shown literally in a Markdown table cell, on one line (`plain_text.one_line`)."""
    return _MARKDOWN.sub(r"\\\1", html.escape(one_line(text), quote=False))


def file_part(dataset: str) -> str:
    """A dataset's name in a report file's name: `counterfactuals/sd15` (a renderings dataset's
    generator) as `counterfactuals-sd15`."""
    return dataset.replace("/", "-")


def higher_is_better(metric: str) -> bool:
    # Recalls, ODmAP, ECCV / CxC / PMRP, mean/median score deltas and PN (the caption's score
    # falls when its object is removed: the model looks at the object) grow with a better model;
    # the fraction of pairs whose delta is below zero (it prefers the wrong image/caption) shrinks.
    return not metric.endswith("frac_below_zero")


def _fmt(value) -> str:
    if value is None:
        return "n/a"
    text = f"{value:.4f}"
    return "0.0000" if text == "-0.0000" else text  # a tiny negative is no sign worth showing


def cell(record: dict, name: str) -> str:
    """A metric's value as `with_interval` shows it (a record of an older version, or one
    without per-unit form or with --bootstrap 0, has no interval and no note: the value alone)."""
    low, high, note = ((record.get(f) or {}).get(name) for f in ("ci_low", "ci_high", "ci_note"))
    return with_interval(record["metrics"].get(name), low, high, note)


def with_interval(value, low=None, high=None, note: str | None = None) -> str:
    """`value [low, high]` (its 95 % interval); without one, the value and why (`note`: fixed
    by construction, all n units equal, one cluster, fewer than 6 clusters), or the value alone."""
    if low is not None and high is not None:
        return f"{_fmt(value)} [{_fmt(low)}, {_fmt(high)}]"
    return f"{_fmt(value)} (no interval: {plain(note)})" if note else _fmt(value)


def sample_size(n: int | None, n_clusters: int | None = None) -> str:
    """`n` units (`in K clusters` where clusters differ from units), marked `small sample`
    below SMALL_SAMPLE independent ones; n/a when unknown."""
    if not n:
        return "n/a"
    text = f"{int(n):,}" + (f" in {int(n_clusters):,} clusters" if n_clusters and n_clusters != n else "")
    return text + (", small sample" if (n_clusters or n) < SMALL_SAMPLE else "")


def units_of(records, name: str) -> int | None:
    """The units (`n_units`) of metric `name` in the first of `records` that has them."""
    return next((r["n_units"][name] for r in records if (r.get("n_units") or {}).get(name)), None)


def clusters(records, name: str) -> int | None:
    """The clusters (`n_clusters`, where the records have them) of metric `name`."""
    return next((r["n_clusters"][name] for r in records if (r.get("n_clusters") or {}).get(name)), None)


def natural(text: str) -> tuple:
    """Sort key reading digit runs as numbers: R@1, R@5, R@10 (not R@1, R@10, R@5)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text))


def rank_models(records: list[dict], dataset: str, task: str, metric: str) -> list[str]:
    """Models best first on one metric (models without a value left out)."""
    values = {r["model"]: r["metrics"].get(metric) for r in records if r["dataset"] == dataset and r["task"] == task}
    known = [(v, m) for m, v in values.items() if v is not None]
    known.sort(key=lambda vm: vm[0], reverse=higher_is_better(metric))
    return [m for _, m in known]


#: Too many columns for a side-by-side table (80 COCO classes x k): per model tables and charts.
#: The blind baseline's text-only models have a section of their own.
PER_MODEL_ONLY = {"odmap_per_class", BLIND}


def in_comparison(task: str, name: str) -> bool:
    # PN per removed class is as wide as ODmAP per class: the comparison shows its mean.
    return task not in PER_MODEL_ONLY and (task != "necessity" or name == "PN_mean")


def comparison_columns(records: list[dict], dataset: str) -> list[tuple[str, str]]:
    """(task, metric) of every column of `dataset`'s comparison, in natural order (R@1, R@5, R@10)."""
    cols = {
        (r["task"], name)
        for r in records
        if r["dataset"] == dataset
        for name in r["metrics"]
        if in_comparison(r["task"], name)
    }
    return sorted(cols, key=lambda tn: (natural(tn[0]), natural(tn[1])))


def model_table(records: list[dict], model: str) -> list[str]:
    lines = ["| dataset | task | metric | value |", "|---|---|---|---|"]
    for r in records:
        if r["model"] == model:
            task = plain(r["task"]) + ranking(r)
            lines += [
                f"| {plain(r['dataset'])} | {task} | {plain(name)} | {cell(r, name)}{_n_note(r, name)} |"
                for name in sorted(r["metrics"], key=natural)
            ]
    return lines


def ranking(record: dict) -> str:
    """` (ranked by: method, k = K, first stage MODEL)` of a cross-encoder's ranked record
    (training/rerank.py); nothing for any other."""
    found = record.get("retrieval")
    if not found:
        return ""
    first = f", first stage {plain(found['first_stage'])}" if found.get("first_stage") else ""
    return f" (ranked by {plain(found['method'])}, k = {found['k']}{first})"


def _n_note(record: dict, name: str) -> str:
    """` (n = ...)` of a record's metric with units, nothing without."""
    n = (record.get("n_units") or {}).get(name)
    return f" (n = {sample_size(n, clusters([record], name))})" if n else ""


def _interval_verdicts(records: list[dict], dataset: str) -> dict[tuple[str, str], tuple[str, bool]]:
    """Without per-unit scores (the Hub card's rows): the best beats the runner-up where their
    95 % intervals do not overlap (a stricter rule than a paired test at alpha = 0.05); values
    without intervals (rows of older versions) are ranked untested, as before."""
    out = {}
    for task, name in comparison_columns(records, dataset):
        ranked = rank_models(records, dataset, task, name)
        if len(ranked) < 2:
            continue
        rows = {r["model"]: r for r in records if r["dataset"] == dataset and r["task"] == task}
        ends = [
            ((rows[m].get("ci_low") or {}).get(name), (rows[m].get("ci_high") or {}).get(name)) for m in ranked[:2]
        ]
        if any(e is None for pair in ends for e in pair):
            out[(task, name)] = (ranked[0], None)
            continue
        (low0, high0), (low1, high1) = ends
        out[(task, name)] = (ranked[0], high1 < low0 if higher_is_better(name) else low1 > high0)
    return out


def comparison_table(
    records: list[dict],
    dataset: str,
    models: list[str],
    verdicts: dict[tuple[str, str], tuple] | None = None,
) -> list[str]:
    """One row per model, one column per metric (`value [low, high]`), then each column's n and
    the chance level. `verdicts` ((task, metric) -> (best model, beats the runner-up[, the
    smallest difference detectable at 80 % power]), from the paired tests): the best value is
    bold where it beats the runner-up; where it does not, the column says once
    `no significant difference (n = ...)` (failing to reject is no
    equivalence); without them, the intervals decide (`_interval_verdicts`); an untested best
    (None) is bold, as values without intervals cannot be tested."""
    cols = comparison_columns(records, dataset)
    verdicts = _interval_verdicts(records, dataset) if verdicts is None else verdicts
    mine = [r for r in records if r["dataset"] == dataset]
    by_model = {(r["model"], r["task"]): r for r in mine}
    lines = ["| model | " + " | ".join(plain(f"{t}/{n}") for t, n in cols) + " |", "|---|" + "---|" * len(cols)]
    for model in models:
        cells = []
        for task, name in cols:
            r = by_model.get((model, task))
            text = cell(r, name) if r else "n/a"
            best, beats = verdicts.get((task, name), (None, False))[:2]
            cells.append(f"**{text}**" if model == best and beats is not False else text)
        lines.append(f"| {plain(model)} | " + " | ".join(cells) + " |")
    sizes = {tn: sample_size(*_units(mine, *tn)) for tn in cols}
    if any(size != "n/a" for size in sizes.values()):
        lines.append("| *n (units)* | " + " | ".join(sizes.values()) + " |")
    untested = {tn for tn in cols if tn in verdicts and verdicts[tn][1] is False}
    if untested:
        lines.append(
            "| *best vs runner-up* | "
            + " | ".join(_no_difference(sizes[tn], verdicts[tn]) if tn in untested else "-" for tn in cols)
            + " |"
        )
    chance: dict[tuple[str, str], set] = {}
    for r in mine:
        for n, v in (r.get("chance") or {}).items():
            chance.setdefault((r["task"], n), set()).add(v)
    if any((t, n) in chance for t, n in cols):
        lines.append("| *chance level* | " + " | ".join(_chance(chance.get(tn)) for tn in cols) + " |")
    return lines


def _chance(values: set | None) -> str:
    """A column's chance level; a floor computed from each model's own scores (PN) differs by
    model: its range."""
    if not values:
        return "-"
    known = sorted(v for v in values if v is not None)
    if len(known) < 2:
        return _fmt(known[0] if known else None)
    return f"{_fmt(known[0])} to {_fmt(known[-1])} (per model)"


def _no_difference(size: str, verdict: tuple) -> str:
    """A column without a winner: its n and, from a paired test, the smallest difference it
    could detect (80 % power, compare.detectable); untested, why (compare.Comparison.note): below
    MIN_CLUSTERS clusters no p-value could reach 0.05, so `not testable`."""
    power, note = (*verdict[2:], None, None)[:2]
    if note:
        return f"not testable (n = {size})" if note == FEW_CLUSTERS else f"not tested: {note}"
    known = power is not None and power == power  # not NaN
    return f"no significant difference (n = {size}" + (f"; detectable with 80 % power: {power:.4f})" if known else ")")


def _units(records: list[dict], task: str, name: str) -> tuple[int | None, int | None]:
    rows = [r for r in records if r["task"] == task]
    return units_of(rows, name), clusters(rows, name)


BLIND_MEANING = (
    "How often a text-only model, which never sees the image, prefers the original "
    "caption over the counterfactual one (a tie counts one half): near 50 % the "
    "captions alone do not give a pair away; far from 50 % they do. Such a prior cannot "
    "inflate IR_c = G(C_c, I_c) - G(C_c, I_o): both terms score the same caption, so it "
    "cancels. It can inflate TR_c = G(C_c, I_c) - G(C_o, I_c) only where it favours the "
    "counterfactual caption (prefers-original below 50 %); one that favours the original "
    "lowers TR_c. The last column says which. "
    "The LM scores a caption by its perplexity (the builder's filter chose the captions "
    "by it), the sentence model by its cosine to the mean embedding of all the set's "
    "captions. Same-word pairs (the two captions are the same words in another order) "
    "are counted and scored apart."
)


def _count(value) -> str:
    return "n/a" if value is None else f"{int(value):,}"


def blind_lines(records: list[dict], dataset: str) -> list[str]:
    """The blind text-only baseline's section of `dataset` (none without its records)."""
    rows = [r for r in records if r["dataset"] == dataset and r["task"] == BLIND]
    if not rows:
        return []
    first = rows[0]["metrics"]
    lines = [
        "#### Blind text-only baseline",
        "",
        BLIND_MEANING,
        "",
        f"Same-word pairs: {_count(first.get('same_word_pairs'))} of {_count(first.get('pairs'))}.",
        "",
        "| text model | metric | value | chance | a text-only prior could inflate |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines += [
            f"| {plain(r['model'])} | {plain(name)} | {cell(r, name)}{_n_note(r, name)} "
            f"| {_fmt((r.get('chance') or {}).get(name))} | {prior_effect(*(f.get(name) for f in (r['metrics'], r.get('ci_low') or {}, r.get('ci_high') or {})))} |"
            for name in sorted(r["metrics"], key=natural)
            if "prefers" in name
        ]
    return lines


@dataclass
class Extras:
    """What report.md shows beside the records, per dataset: the paired tests' verdicts and
    table, and the forest plot's file."""

    verdicts: dict[str, dict] = field(default_factory=dict)
    comparisons: dict[str, list[str]] = field(default_factory=dict)
    #: dataset -> the per-class paired differences' table (a Holm family of its own).
    class_comparisons: dict[str, list[str]] = field(default_factory=dict)
    forest: dict[str, str] = field(default_factory=dict)
    #: False with --no-plots: no figure was drawn, so none is linked.
    figures: bool = True
    baseline: str | None = None
    #: dataset -> a sentence about a floor that could not be computed.
    notes: dict[str, str] = field(default_factory=dict)
    #: The per-generator table and the generator-bias table of a renderings dataset
    #: (training/report/generator_bias.py).
    generators: list[str] = field(default_factory=list)
    #: model (as the records name it) -> where it came from (training/report/models.py
    #: `model_origin`: the base and run of a finetuned model, a tiny model's role).
    origins: dict[str, str] = field(default_factory=dict)


def _settings(records: list[dict]) -> str:
    first = records[0] if records else {}
    if not first.get("bootstrap"):
        return "No intervals (`--bootstrap 0`)."
    return (
        f"Each value is shown as `value [low, high]`: its 95 % interval over the metric's "
        f"independent units (images with all their captions for retrieval, queries for ODmAP@k, "
        f"pairs for the ITM deltas, removal pairs for PN; pairs and queries of one source image "
        f"resampled together), made as its kind needs (each record's `ci_method`: Clopper-Pearson "
        f"for proportions, studentized bootstrap for means, percentile bootstrap for medians; "
        f"docs/report.md), {first['bootstrap']} resamples, seed {first.get('seed')}; metrics "
        "without per-unit scores (ECCV Caption suite) have none; the others without one say why "
        "(each record's `ci_note`): fixed by construction (`trivial`: R@K with K at least the gallery), "
        "all n units equal (a sample without spread, which is no evidence that the population has "
        f"none), one cluster, or fewer than {MIN_CLUSTERS} clusters (source images: too few for a "
        "bootstrap, whose resamples then draw one cluster again and again). Code version "
        f"`{plain(first.get('code_version'))}`."
    )


def render_report(records: list[dict], extras: Extras | None = None) -> str:
    extras = extras or Extras()
    models = list(dict.fromkeys(r["model"] for r in records if r["task"] != BLIND))
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    out = [
        "# Model report",
        "",
        "Every number is computed by the project's metric modules (counterfactory_metrics) "
        "through the trainer's evaluation (`--eval-only`); `results.jsonl` has each record "
        "with its model digest and dataset commit.",
        "",
        _settings(records),
        "",
        *(
            []
            if extras.figures
            else ["Figures: not drawn (`--no-plots`); run without it for the forest plots and histograms.", ""]
        ),
    ]
    out += _models_section(models, extras.origins)
    out += [
        "## Comparison",
        "",
        "Bold: the best value of its column (fraction below zero: lowest; every other metric: "
        "highest) where it beats the runner-up at alpha = 0.05 in a paired test on the same units, "
        "Holm-corrected across the tests of the dataset table's columns: a difference in means "
        "(means, ratios, proportions) by the bootstrap-t test, a median or a mean over groups by "
        "the sign-flip permutation test, whose hypothesis is that the two models' scores are "
        "exchangeable on each unit. The 95 % intervals are not adjusted for the number of "
        "comparisons; the tests are. Elsewhere the column says `no significant difference`: the "
        "test did not reject, which is no evidence that the models are equal (at small n it has "
        f"little power); below {MIN_CLUSTERS} clusters, where no p-value can reach 0.05, `not "
        "testable`; a metric fixed by construction, or the same difference on every unit, is not "
        f"tested and not in the family. `n (units)`: the independent units of each column; below "
        f"{SMALL_SAMPLE} they are marked `small sample`. Per-class numbers (ODmAP@k and PN per "
        f"removed class) are on the queries that removed the class, with no interval or test below "
        f"{MIN_CLUSTERS} clusters (source images), and their tests are a Holm family of their own.",
        "",
    ]
    for dataset in datasets:
        out += _dataset_section(records, dataset, models, extras)
    out += extras.generators
    out += ["## Per model", ""]
    for model in models:
        out += _model_section(records, model, models.index(model), extras)
    return "\n".join(out)


def _models_section(models: list[str], origins: dict[str, str]) -> list[str]:
    """Each model as the tables name it, and where it came from."""
    if not origins:
        return []
    lines = [f"- {plain(m)}: {plain(origins.get(m, m))}" for m in models]
    return ["## Models", "", *lines, ""]


def _dataset_section(records: list[dict], dataset: str, models: list[str], extras: Extras) -> list[str]:
    """One dataset's part of the comparison: the models side by side, then what report.md has
    beside the table (forest plot, paired differences, blind baseline, floor note), each only
    where it was made."""
    source = next(r["dataset_source"] for r in records if r["dataset"] == dataset)
    against = f" against the baseline {plain(extras.baseline)}" if extras.baseline else ""
    out = [
        f"### {plain(dataset)} ({plain(source)})",
        "",
        # Bold only where a paired test rejects: no test (one model, --bootstrap 0), no bold.
        *comparison_table(records, dataset, models, extras.verdicts.get(dataset, {})),
        "",
    ]
    if dataset in extras.forest:
        out += [f"![value and 95 % interval per model on {plain(dataset)}]({extras.forest[dataset]})", ""]
    if extras.comparisons.get(dataset):
        out += [f"Paired differences{against} (same units, same resamples):", "", *extras.comparisons[dataset], ""]
    if extras.class_comparisons.get(dataset):
        out += [
            f"Per-class paired differences{against} (each class on its own queries; a Holm family of "
            "their own, apart from the table above):",
            "",
            *extras.class_comparisons[dataset],
            "",
        ]
    blind = blind_lines(records, dataset)
    out += [*blind, ""] if blind else []
    out += [plain(extras.notes[dataset]), ""] if dataset in extras.notes else []
    return out


def _model_section(records: list[dict], model: str, n: int, extras: Extras) -> list[str]:
    """One model's part of the per-model section: its weights digest, its figures (named by its
    position `n` in the report, as training/report/run.py draws them) and its table of every
    metric."""
    digest = next(r["weights_digest"] for r in records if r["model"] == model)
    origin = extras.origins.get(model)
    out = [f"### {plain(model)}", "", *([plain(origin), ""] if origin and origin != model else [])]
    out += [f"weights {plain(digest)}", ""]
    if extras.figures and any(r["task"] == "odmap_per_class" and r["model"] == model for r in records):
        out += [f"![ODmAP@k per removed class](odmap_per_class-model{n}.png)", ""]
    itm = [r["dataset"] for r in records if extras.figures and r["model"] == model and r["task"] == "itm"]
    for dataset in dict.fromkeys(itm):
        out += [f"![ITM score deltas on {plain(dataset)}](itm_deltas-model{n}-{file_part(dataset)}.png)", ""]
    return [*out, *model_table(records, model), ""]
