"""Model-bias analysis of a MITL round (the ECCV Caption paper's Appendix E; METHOD.md §5).

From one round's human-verified positive pairs, build one positive set per machine annotator
(the verified positives that annotator proposed: the dataset a single-model MITL round would
have produced) and the set of all of them. Every evaluated model then ranks the gallery as
`candidates` ranks it (`candidates.annotator_topk`), and is scored with mAP@R (also R-Precision
and R@1) on each set: a model with embeddings (a CLIP, a contrastive head) over the full
gallery, a re-ranker (BLIP, ViLT and BridgeTower ITM) from its re-ranked top `rerank_k`, exact
since mAP@R and R-Precision read only the top R ranks and R@1 the first (a query with R >
`rerank_k` is refused). A dataset free of model bias ranks the models the same way whichever
annotator built it; the bias of a set Θ is B_Θ = mean over models |s_Θ(model) - s_All(model)|
(the paper's Eq. E.5), split into self-bias (models in Θ) and non-self-bias (the others).

Writes `model_bias.csv`, `model_bias.md` (mAP@R and each model's rank per set, Kendall's tau
of each set's ranking against the ranking by all annotators, and the bias table) and
`model_bias.png` (one line per evaluated model across the annotation sets) into the output folder.
"""

from __future__ import annotations

import csv
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from builders.eccv_positives.config import MITL_REPORT
from builders.eccv_positives.mitl.candidates import (
    MODALITIES,
    Candidates,
    CandidatesConfig,
    annotator_topk,
    check_annotator,
    default_cache_dir,
    distinct_captions,
    first_stage_head,
    reranks,
)
from builders.eccv_positives.mitl.cross_annotators import record
from builders.eccv_positives.mitl.embeddings import gallery_embeddings
from builders.engine.precision import worker_precision
from builders.eccv_positives.mitl.tasks import load_tasks
from builders.engine.errors import InputFileError, UserFacingError
from builders.viewer.plots import plain_text
from builders.engine.provenance import model_name, model_names
from builders.models.cross_ranking import CONTRASTIVE_METHOD
from builders.models.families import DEFAULT_K

log = logging.getLogger(__name__)

ALL = "all"
METRICS = ("map_at_r", "r_precision", "recall_at_1")
QUERY_CHUNK = 256


@dataclass
class ModelBiasConfig:
    """Example: `ModelBiasConfig(tasks="run/tasks", state="run/state", output="run/bias")`."""

    tasks: str
    #: The ingest state folder (its `annotations/mitl_report.json` holds the verified pairs).
    state: str
    output: str
    #: Models to rank (default: the machine annotators of the round).
    models: tuple[str, ...] = ()
    #: Embedding cache (default: the one the round's `candidates` run used).
    cache_dir: str | None = None
    #: Precision of the forward passes (as `CandidatesConfig.dtype`; the round's own to reuse
    #: its cached embeddings).
    dtype: str = "auto"
    #: As `CandidatesConfig.first_stage` and `.rerank_k`; default: the round's own (recorded in
    #: candidates.json's config) when its annotators are ranked, else none and DEFAULT_K.
    first_stage: str | None = None
    rerank_k: int | None = None


def annotation_sets(report: dict[str, Any], cands: Candidates) -> dict[str, dict[str, dict[int, list[int]]]]:
    """Set name (an annotator id, or `all`) -> modality -> query id -> positive ids."""
    proposers = {(c["modality"], c["query_id"], c["item_id"]): set(c["proposed_by"]) for c in cands.candidates}
    sets: dict[str, dict[str, dict[int, list[int]]]] = {}
    for name in [*report["models"], ALL]:
        chosen: dict[str, dict[int, list[int]]] = {"i2t": {}, "t2i": {}}
        for modality, query, item in report["human_positive_pairs"]:
            if name == ALL or name in proposers.get((modality, query, item), ()):
                chosen[modality].setdefault(query, []).append(item)
        # Named as the scored models are (a round recorded by an older version holds specs).
        sets[name if name == ALL else model_name(name)] = chosen
    return sets


def score_models(cfg: ModelBiasConfig) -> list[dict[str, Any]]:
    """One row per (evaluated model, annotation set, modality): how the model ranked (`retrieval`,
    `k`, `first_stage`, the benchmark's words) and its mAP@R, R-P and R@1."""
    report_path = Path(cfg.state) / "annotations" / MITL_REPORT
    if not report_path.is_file():
        raise InputFileError(report_path, "no ingested verdicts", "run `counterfactory eccv ingest` first")
    report = json.loads(report_path.read_text())
    cands = Candidates.load(Path(load_tasks(Path(cfg.tasks))["config"]["candidates"]))
    sets = annotation_sets(report, cands)
    # Models to rank (specs): those asked for, else the round's annotators, whose specs as given
    # `candidates` kept in `model_sources`; reports and tables name each by `model_name`.
    sources = cands.config.get("model_sources", {})
    models = list(cfg.models) or [sources.get(name, name) for name in report["models"]]
    names = model_names({m: m for m in models})
    ranking = _ranking(cfg, cands.config, models)
    heads = {model: check_annotator(model) for model in models}
    first_head = first_stage_head(ranking, heads)  # candidates' checks, before any model is loaded
    if any(map(reranks, heads.values())):
        _check_depth(sets[ALL], ranking.rerank_k)
    # The round's own cache (recorded by `candidates`) holds the annotators' embeddings already.
    round_cache = cands.config.get("cache_dir")
    cache = Path(cfg.cache_dir or round_cache or default_cache_dir())
    # Every set's queries are among `all`'s: one ranking per model serves every set.
    round_ = (cands.gallery, {m: sorted(sets[ALL][m]) for m in MODALITIES}, cache)
    first_name = model_name(ranking.first_stage) if ranking.first_stage else None
    rows = []
    precision = worker_precision(cfg.dtype)
    for model in models:
        scores = _scorer(model, (heads[model], first_head), ranking, round_, precision)
        how = _ranked_by(heads[model], ranking.rerank_k, first_name)
        for set_name, positives in sets.items():
            for modality in MODALITIES:
                pos = positives[modality]
                if pos:
                    row = {"model": names[model], **how, "annotation_set": set_name, "modality": modality}
                    rows.append({**row, "queries": len(pos), **scores(modality, pos)})
    if not rows:
        raise UserFacingError(f"{report_path}: no verified positive pair to score models on")
    return rows


def _ranking(cfg: ModelBiasConfig, round_config: dict[str, Any], models: list[str]) -> CandidatesConfig:
    """The candidates settings the models rank with: `--first-stage` and `--rerank-k` as given,
    else the round's own when its annotators are ranked; ranked lists `rerank_k` deep (a
    re-ranker's whole re-ranked top)."""
    own = {} if cfg.models else round_config
    k = cfg.rerank_k or own.get("rerank_k") or DEFAULT_K
    first = cfg.first_stage or own.get("first_stage")
    return CandidatesConfig(models=tuple(models), first_stage=first, rerank_k=k, exclusion_depth=k, dtype=cfg.dtype)


def _check_depth(positives: dict[str, dict[int, list[int]]], k: int) -> None:
    """A re-ranker is scored from its top k, exact only where every query's R <= k: refused in one
    line otherwise (raising k re-scores k pairs a query; the user chooses that cost)."""
    over = [len(set(p)) for by_query in positives.values() for p in by_query.values() if len(set(p)) > k]
    if over:
        raise UserFacingError(
            f"{len(over)} queries have more verified positives than --rerank-k {k}, which a re-ranker's "
            f"mAP@R needs in its top --rerank-k: pass --rerank-k {max(over)} or more"
        )


def _ranked_by(head: str | None, k: int, first_stage: str | None) -> dict[str, Any]:
    """How a model (head None: a CLIP) ranks, in the words of the benchmark's `retrieval` records
    (cross_annotators.record): a CLIP, like a contrastive head, by its embeddings, k 0."""
    found = record(head, k, first_stage) if head else {"method": CONTRASTIVE_METHOD, "k": 0, "first_stage": None}
    return {"retrieval": found["method"], "k": found["k"], "first_stage": found["first_stage"] or ""}


def _scorer(model: str, heads: tuple, ranking: CandidatesConfig, round_: tuple, precision) -> Any:
    """(modality, positives) -> `model`'s METRICS, ranking as `candidates` ranks it: a re-ranker
    from its re-ranked top `rerank_k` (`annotator_topk`), any other over the whole gallery by its
    (or its contrastive head's) embeddings."""
    g, queries, cache = round_
    if reranks(heads[0]):
        top = annotator_topk(model, heads, ranking, round_, precision)
        return lambda modality, pos: _topk_scores(top[modality], queries[modality], pos)
    images, captions = gallery_embeddings(model, g, cache, ranking.batch_size, precision, heads[0])
    # Captions are scored once per distinct text and the columns copied, so repeated captions
    # tie exactly and rank by gallery index, as in the candidates (METHOD.md §2).
    reps, slot = distinct_captions(captions, g.captions)
    sims = {
        "i2t": (images, np.asarray(captions[reps]), slot, g.image_ids, g.caption_ids),
        "t2i": (captions, images, None, g.caption_ids, g.image_ids),
    }
    return lambda modality, pos: _mean_scores(*sims[modality], pos)


def _topk_scores(top: np.ndarray, q_ids: list[int], pos: dict[int, list[int]]) -> dict[str, float]:
    """The METRICS of the queries of `pos` from their ranked lists (`top`: a row per query of
    `q_ids`), each at least R long (`_check_depth`), so the same as from the full ranking."""
    from counterfactory_metrics.map_at_r.retrieval import RetrievalMetricConfig, retrieval_scores

    row_of = {q: n for n, q in enumerate(q_ids)}
    ranked = {q: top[row_of[q]].tolist() for q in pos}
    scores = retrieval_scores(ranked, pos, RetrievalMetricConfig(k_values=(1,))).as_dict()
    return {m: scores[m] for m in METRICS}


def _mean_scores(
    q_emb: np.ndarray,
    g_emb: np.ndarray,
    columns: np.ndarray | None,
    q_ids: list[int],
    g_ids: list[int],
    pos: dict[int, list[int]],
) -> dict[str, float]:
    """The METRICS of the queries of `pos` (query id -> positive ids) retrieving over the gallery
    `g_ids`, averaged over those queries; `columns` gives each gallery item's row of `g_emb` (None:
    row i is item i). Query chunks bound the score matrix (a 600K-caption gallery); the metrics
    are means over queries, so chunk means weighted by chunk size give the same numbers."""
    from counterfactory_metrics.map_at_r.retrieval import RetrievalMetricConfig, retrieval_scores_from_similarity

    row_of = {q: n for n, q in enumerate(q_ids)}
    queries = sorted(pos)
    totals = dict.fromkeys(METRICS, 0.0)
    for start in range(0, len(queries), QUERY_CHUNK):
        chunk = queries[start : start + QUERY_CHUNK]
        similarity = q_emb[[row_of[q] for q in chunk]] @ g_emb.T
        if columns is not None:
            similarity = similarity[:, columns]
        scores = retrieval_scores_from_similarity(
            similarity, {q: pos[q] for q in chunk}, chunk, g_ids, RetrievalMetricConfig(k_values=(1,))
        ).as_dict()
        for m in METRICS:
            totals[m] += scores[m] * len(chunk)
    return {m: totals[m] / len(queries) for m in METRICS}


def bias(rows: list[dict[str, Any]], metric: str = "map_at_r") -> dict[str, dict[str, float]]:
    """Per single-annotator set Θ and modality: B_Θ, self-bias and non-self-bias (Eq. E.5)."""
    score = {(r["model"], r["annotation_set"], r["modality"]): r[metric] for r in rows}
    models = sorted({r["model"] for r in rows})
    out: dict[str, dict[str, float]] = {}
    for set_name in sorted({r["annotation_set"] for r in rows} - {ALL}):
        for modality in ("i2t", "t2i"):
            gaps = {
                m: abs(score[(m, set_name, modality)] - score[(m, ALL, modality)])
                for m in models
                if (m, set_name, modality) in score and (m, ALL, modality) in score
            }
            if not gaps:
                continue
            own = [v for m, v in gaps.items() if m == set_name]
            other = [v for m, v in gaps.items() if m != set_name]
            out[f"{set_name}/{modality}"] = {
                "bias": float(np.mean(list(gaps.values()))),
                "self_bias": float(np.mean(own)) if own else float("nan"),
                "non_self_bias": float(np.mean(other)) if other else float("nan"),
            }
    return out


def rankings(rows: list[dict[str, Any]], modality: str, metric: str = "map_at_r") -> dict[str, dict[str, int]]:
    """Per annotation set, each model's rank by `metric` (1 = best; ties share the better rank)."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        if r["modality"] == modality:
            out.setdefault(r["annotation_set"], {})[r["model"]] = r[metric]
    return {
        name: {m: 1 + sum(v > s for v in scores.values()) for m, s in scores.items()} for name, scores in out.items()
    }


def rank_agreement(rows: list[dict[str, Any]], modality: str) -> dict[str, float]:
    """Kendall's tau between each single-annotator set's ranking of the models and the ranking by
    the set of all annotators (1: the same order, an unbiased set; Appendix E compares rankings)."""
    from scipy.stats import kendalltau

    ranks = rankings(rows, modality)
    reference = ranks.get(ALL, {})
    out = {}
    for name, by_model in ranks.items():
        models = sorted(set(by_model) & set(reference))
        if name != ALL and len(models) >= 2:
            tau = kendalltau([by_model[m] for m in models], [reference[m] for m in models]).statistic
            out[name] = float(tau)
    return out


def write_report(cfg: ModelBiasConfig, rows: list[dict[str, Any]]) -> Path:
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "model_bias.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    sets = list(dict.fromkeys(r["annotation_set"] for r in rows))
    lines = []
    for modality in ("i2t", "t2i"):
        ranks, tau = rankings(rows, modality), rank_agreement(rows, modality)
        lines += [
            f"### {modality} mAP@R (rank) (rows: evaluated model, columns: annotation set)",
            "",
            "| model | " + " | ".join(sets) + " |",
            "|---" * (len(sets) + 1) + "|",
        ]
        for model in dict.fromkeys(r["model"] for r in rows):
            cells = {
                r["annotation_set"]: r["map_at_r"] for r in rows if r["model"] == model and r["modality"] == modality
            }
            lines.append(
                f"| {model}{_ranked_words(rows, model)} | "
                + " | ".join(f"{cells[s]:.4f} (#{ranks[s][model]})" if s in cells else "-" for s in sets)
                + " |"
            )
        lines.append("| Kendall τ vs all | " + " | ".join(f"{tau[s]:.2f}" if s in tau else "-" for s in sets) + " |")
        lines.append("")
    lines += ["### Bias (Eq. E.5, mAP@R)", "", "| set/modality | B | self | non-self |", "|---|---|---|---|"]
    lines += [
        f"| {k} | {v['bias']:.4f} | {v['self_bias']:.4f} | {v['non_self_bias']:.4f} |" for k, v in bias(rows).items()
    ]
    (out / "model_bias.md").write_text("\n".join(lines) + "\n")
    _plot(rows, sets, out / "model_bias.png")
    return out


def _ranked_words(rows: list[dict[str, Any]], model: str) -> str:
    """` (ranked by METHOD, k = K, first stage NAME)` of a model's rows, as the benchmark's
    tables say it (training/report/markdown.py `ranking`); nothing for rows without it."""
    found = next(r for r in rows if r["model"] == model)
    if not found.get("retrieval"):
        return ""
    k = f", k = {found['k']}" if int(found["k"]) else ""
    first = f", first stage {found['first_stage']}" if found["first_stage"] else ""
    return f" (ranked by {found['retrieval']}{k}{first})"


@plain_text  # model and annotator names are drawn as written
def _plot(rows: list[dict[str, Any]], sets: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, modality in zip(axes, ("i2t", "t2i"), strict=True):
        for model in dict.fromkeys(r["model"] for r in rows):
            cells = {
                r["annotation_set"]: r["map_at_r"] for r in rows if r["model"] == model and r["modality"] == modality
            }
            ax.plot(
                range(len(sets)), [cells.get(s, np.nan) for s in sets], marker="o", label=Path(model).name or model
            )
        ax.set_xticks(range(len(sets)), [Path(s).name or s for s in sets], rotation=30, ha="right")
        ax.set_title(f"{modality} mAP@R by annotation set")
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
