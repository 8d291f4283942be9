"""Model-bias analysis of a MITL round (the ECCV Caption paper's Appendix E; METHOD.md §5).

From one round's human-verified positive pairs, build one positive set per machine annotator
(the verified positives that annotator proposed: the dataset a single-model MITL round would
have produced) and the set of all of them. Every evaluated model then retrieves over the full
gallery, and is scored with mAP@R (also R-Precision and R@1) on each set. A dataset free of model
bias ranks the models the same way whichever annotator built it; the bias of a set Θ is
B_Θ = mean over models |s_Θ(model) - s_All(model)| (the paper's Eq. E.5), split into self-bias
(models in Θ) and non-self-bias (the others).

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
    Candidates,
    check_annotator,
    default_cache_dir,
    distinct_captions,
)
from builders.eccv_positives.mitl.embeddings import gallery_embeddings
from builders.engine.precision import worker_precision
from builders.eccv_positives.mitl.tasks import load_tasks
from builders.engine.errors import InputFileError, UserFacingError
from builders.viewer.plots import plain_text
from builders.engine.provenance import model_name, model_names

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
    """One row per (evaluated model, annotation set, modality) with mAP@R, R-P and R@1."""
    report_path = Path(cfg.state) / "annotations" / MITL_REPORT
    if not report_path.is_file():
        raise InputFileError(report_path, "no ingested verdicts", "run `counterfactory eccv ingest` first")
    report = json.loads(report_path.read_text())
    cands = Candidates.load(Path(load_tasks(Path(cfg.tasks))["config"]["candidates"]))
    sets = annotation_sets(report, cands)
    # Models to embed with (specs): those asked for, else the round's annotators, whose specs as
    # given `candidates` kept in `model_sources`; reports and tables name each by `model_name`.
    sources = cands.config.get("model_sources", {})
    models = list(cfg.models) or [sources.get(name, name) for name in report["models"]]
    names = model_names({m: m for m in models})
    for model in models:
        # mAP@R here ranks the whole gallery by embedding; a cross-encoder's full ranking is
        # |images| x |captions| forward calls, not built: refused in one line, not loaded as a CLIP.
        if check_annotator(model):
            raise UserFacingError(
                f"model-bias ranks by embeddings; {model[:200]!r} is a cross-encoder: "
                "pass --model for each dual-encoder (CLIP) annotator instead"
            )
    # The round's own cache (recorded by `candidates`) holds the annotators' embeddings already.
    round_cache = cands.config.get("cache_dir")
    cache = Path(cfg.cache_dir or round_cache or default_cache_dir())
    g = cands.gallery
    rows = []
    precision = worker_precision(cfg.dtype)
    for model in models:
        images, captions = gallery_embeddings(model, g, cache, precision=precision)
        # Captions are scored once per distinct text and the columns copied, so repeated captions
        # tie exactly and rank by gallery index, as in the candidates (METHOD.md §2).
        reps, slot = distinct_captions(captions, g.captions)
        sims = {
            "i2t": (images, np.asarray(captions[reps]), slot, g.image_ids, g.caption_ids),
            "t2i": (captions, images, None, g.caption_ids, g.image_ids),
        }
        for set_name, positives in sets.items():
            for modality, sim in sims.items():
                pos = positives[modality]
                if not pos:
                    continue
                rows.append(
                    {
                        "model": names[model],
                        "annotation_set": set_name,
                        "modality": modality,
                        "queries": len(pos),
                        **_mean_scores(*sim, pos),
                    }
                )
    if not rows:
        raise UserFacingError(f"{report_path}: no verified positive pair to score models on")
    return rows


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
                f"| {model} | "
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
