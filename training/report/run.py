"""Score every model on every dataset with `training.evaluation.evaluate_model` (the code the
trainer's `--eval-only` runs), then write `results.jsonl` and `report.md`."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from builders.engine.errors import OutputError, UserFacingError
from builders.publishing.hub_client import check_repo_id
from counterfactory_metrics.itm_score_deltas.deltas import itm_deltas, plot_histograms
from training.evaluation import evaluate_model, necessity, original_rows
from training.report.cache import cache_key, load_arrays, new_file, read_entry, write_entry
from training.report.datasets import KINDS, open_dataset, parse_source
from training.report.hub_results import push_results
from training.report.markdown import render_report
from training.report.per_class import odmap_per_class, per_class_metrics, plot
from training.report.models import (embedding_width, load_model, parse_model, preprocessing_digest,
                                    weights_digest)
from training.report.results import make_records, write_results

log = logging.getLogger(__name__)

#: The embeddings object necessity reads, per dataset (`_necessity`): kept until the model's last
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


def run_benchmark(cfg: BenchmarkConfig) -> list[dict]:
    """Every record, also written to OUTPUT/results.jsonl and OUTPUT/report.md. Every input is
    checked (datasets opened, model names parsed) before the first model is loaded."""
    if not cfg.models:
        raise UserFacingError("give at least one --model")
    if len(set(cfg.models)) != len(cfg.models):
        raise UserFacingError(f"--model: {sorted({m for m in cfg.models if cfg.models.count(m) > 1})} "
                              "given twice; give each model once")
    sources = {name: text for name, text in cfg.sources.items() if text}
    if not sources:
        raise UserFacingError(f"give at least one dataset: {', '.join('--' + k for k in KINDS)}")
    if cfg.push_to_hub:
        check_repo_id(cfg.push_to_hub)
    elif cfg.revision_tag:
        raise UserFacingError("--revision-tag tags the --push-to-hub repo: give --push-to-hub ORG/NAME too")
    specs = [parse_model(m) for m in cfg.models]
    if cfg.coco_instances and "coco" not in sources:
        raise UserFacingError("--coco-instances adds PMRP to the COCO 5K scores: give --coco too")
    output = Path(cfg.output)
    cache = Path(cfg.cache_dir) if cfg.cache_dir else output / "embeddings"
    folders = {"--output": output, "--cache-dir": cache}
    for flag, folder in folders.items():
        _check_folder(flag, folder)
    sets = [open_dataset(name, parse_source(name, text), cfg.eval_batch_size, cfg.num_workers,
                         cfg.k_values, cfg.coco_instances) for name, text in sources.items()]
    for flag, folder in folders.items():
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OutputError(f"{flag} {folder}: cannot create it ({err.strerror or err}); "
                              "give a folder you may write") from None
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    records: list[dict] = []
    bar = None
    for n, spec in enumerate(specs):
        backend = load_model(spec, cfg.trust_pickled_weights)
        # Started after the first model loads, so a bad --model leaves only its error line.
        bar = bar or tqdm(total=len(specs) * len(sets), desc="model x dataset", unit="eval")
        backend.module.to(device)
        digests = (weights_digest(backend.module), preprocessing_digest(backend))
        width = embedding_width(backend)
        scored = {}  # the embeddings PN reads, of this model only
        for ds in sets:
            bar.set_postfix_str(f"{spec.name} on {ds.name}")
            metrics, emb = _score(backend, (*digests, width), ds, output, cache, n)
            if ds.name in PN_ARRAYS:
                scored[ds.name] = {k: emb[k] for k in PN_ARRAYS[ds.name] if k in emb}
            records += make_records(spec, digests[0], ds, metrics)
            bar.update()
        if {"coco", "decorrelation"} <= scored.keys():
            by_name = {ds.name: ds for ds in sets}
            records += make_records(spec, digests[0], by_name["decorrelation"],
                                    _necessity(by_name["coco"], by_name["decorrelation"], scored))
        del backend  # one model in memory at a time
    bar.close()
    write_results(output / "results.jsonl", records)
    (output / "report.md").write_text(render_report(records))
    log.info("wrote %s and %s (%d records)", output / "results.jsonl", output / "report.md", len(records))
    if cfg.push_to_hub:
        push_results(records, cfg.push_to_hub, cfg.revision_tag)
    return records


def _check_folder(flag: str, folder: Path) -> None:
    """A folder the report writes, checked before anything is read: a file there (or in place of
    a folder above it) is one line naming the flag."""
    for path in (folder, *folder.parents):
        if path.is_dir():
            return
        if os.path.lexists(path):
            where = "" if path == folder else f" ({path} is not a folder)"
            raise OutputError(f"{flag} {folder}: not a folder{where}; give a folder path")


def _score(backend, model: tuple[str, str, int], ds, output: Path, cache: Path,
           n: int) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """evaluate_model's metrics of model number `n` on `ds` (from the cache when these weights and
    preprocessing digests were scored on this data before; `model` is them and the embedding
    width), plus ODmAP per removed class from the embeddings, with its chart and the ITM delta
    histograms; and the embeddings."""
    *digests, width = model
    key = cache_key(*digests, ds)
    hit = read_entry(cache, key, ds.data, width)
    if hit is not None:
        saved, metrics, emb = hit
        log.info("%s on %s: embeddings and metrics from the cache %s", backend.model_id, ds.name, saved)
    else:
        written = new_file(cache, ".npz")
        try:
            metrics = evaluate_model(backend.module, backend, ds.data, ds.cfg, written)
            emb = load_arrays(written)
            try:
                write_entry(cache, key, written, metrics)
            except OSError as err:  # e.g. a folder where the entry goes: the numbers still count
                log.warning("embedding cache %s: cannot store %s on %s (%s); not cached", cache,
                            backend.model_id, ds.name, err)
        finally:
            written.unlink(missing_ok=True)
    if ds.data.queries is not None:
        per_class = odmap_per_class(emb, ds.data, ds.cfg.run.k_values)
        metrics.update(per_class_metrics(per_class))
        plot(per_class, output / f"odmap_per_class-model{n}.png", backend.model_id)
    scores = {k.removeprefix("itm_"): v for k, v in emb.items() if k.startswith("itm_")}
    if scores:
        plot_histograms(itm_deltas(**scores), output / f"itm_deltas-model{n}-{ds.name}.png",
                        title=f"ITM score deltas on {ds.name}: {backend.model_id}")
    return metrics, emb


def _necessity(coco, dec, scored: dict[str, dict[str, np.ndarray]]) -> dict[str, float]:
    """Object necessity PN per removed class: x is the query's source image among the --coco
    build's images, x' and y come from the decorrelation build, as the trainer's --eval-only
    scores them with both (training.evaluation.necessity on the same embeddings)."""
    rows = original_rows(dec.data.query_image_ids, coco.data.image_ids)
    if (rows < 0).all():
        log.warning("object necessity: no decorrelation query's source image is in the --coco "
                    "split; PN needs the split the decorrelation build's images came from")
    return necessity(scored["coco"]["image"], rows, scored["decorrelation"], dec.data)
