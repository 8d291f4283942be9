"""Stage 1 of a MITL round: machine annotators propose candidate positives (METHOD.md §2).

Queries are sampled from the gallery (`image_queries` images and `caption_queries` captions,
seeded); every model retrieves its top-k (paper: 5) from the *whole* gallery for each query, by
streaming top-k over the cached embeddings (no query x gallery matrix, so a 600K-caption gallery
fits). Ties go to the lower gallery index; a caption text repeated in the gallery is scored once,
so its copies tie exactly. The proposals are unioned and deduplicated; each candidate keeps the
models that proposed it and their ranks (1 = best). Each query also records the union of the
models' top-`exclusion_depth` (paper: 25), from which golden negatives must stay away.

Output: one JSON file (`candidates.json`) holding the config, the gallery, the queries, the
candidates and the exclusion lists: everything `counterfactory eccv tasks` needs. Models are
recorded by their provenance names (`provenance.model_name`: `local:NAME@sha256:...` for a local
folder, the Hub id otherwise), also as the keys of `proposed_by`, so the tasks, the ingest report,
the card of the new version and the model-bias report never name a local path. The one place the
specs as given stay is `config.model_sources` (name -> spec): the round's own working reference,
with which `model-bias` embeds again; it is not copied into the ingest report.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from builders.eccv_positives.mitl.cross_annotators import needs_first_stage, reranked_topk
from builders.eccv_positives.mitl.cross_annotators import record as reranker_record
from builders.eccv_positives.mitl.embeddings import gallery_embeddings
from builders.engine.precision import worker_precision
from builders.eccv_positives.mitl.image_gallery import DatasetSource, Gallery
from builders.engine.errors import InputFileError, UserFacingError
from builders.engine.provenance import model_names
from builders.models.cross_ranking import CONTRASTIVE_METHOD, check_first_stage, method_of
from builders.models.families import DEFAULT_K
from builders.models.families import named_model

log = logging.getLogger(__name__)

MODALITIES = ("i2t", "t2i")


def check_annotator(model: str) -> str | None:
    """Refuse, in one line and before any data is read, a `--model` that cannot annotate
    (`families.named_model`): a transformers config of another family (a BERT ...) would otherwise
    be loaded into a random-init CLIP or fail deep inside the embedding. The architecture of a
    cross-encoder (cross_annotators.py: every head a family accepts annotates), None for a CLIP."""
    family = named_model(model)[1]
    return None if family.dual_encoder else family.architecture


@dataclass
class CandidatesConfig:
    """Example: `CandidatesConfig(models=("openai/clip-vit-base-patch32",), coco_root="coco")`."""

    #: Machine annotators: transformers CLIP ids/folders or open_clip ids (see embeddings.py), or
    #: cross-encoders: BLIP, FLAVA, ViLT, BridgeTower ITM (cross_annotators.py).
    models: tuple[str, ...]
    #: The gallery: a COCO download (images, captions, Karpathy split file) ...
    coco_root: str | None = None
    #: ... its Karpathy splits (paper: the 5K test split) ...
    splits: tuple[str, ...] = ("test",)
    #: ... or any image-caption dataset (exactly one of `coco_root` and `dataset`).
    dataset: DatasetSource | None = None
    #: Sampled image and caption queries (paper: 1,261 and 1,333); capped at the gallery size.
    image_queries: int = 1261
    caption_queries: int = 1333
    seed: int = 0
    #: Candidates per model and query (paper: top-5).
    k: int = 5
    #: Golden negatives are drawn outside every model's top-`exclusion_depth` (paper: 25).
    exclusion_depth: int = 25
    #: Embedding cache (default: $COUNTERFACTORY_CACHE/eccv_embeddings); recorded in
    #: candidates.json, where `model-bias` finds it.
    cache_dir: str | None = None
    batch_size: int = 64
    #: Precision of the annotators' forward passes (`builders.engine.precision`; auto: fp16 on
    #: a GPU, fp32 elsewhere); the resolved one is recorded as `precision`.
    dtype: str = "auto"
    #: A ViLT or BridgeTower ITM annotator re-ranks this model's top `rerank_k` (a CLIP, or a model
    #: with contrastive embeddings: `cross_ranking.check_first_stage`), BLIP its own ITC's.
    first_stage: str | None = None
    #: BLIP's COCO `k_test` (salesforce/BLIP configs/retrieval_coco.yaml), as the report's default.
    rerank_k: int = DEFAULT_K


@dataclass
class Candidates:
    """What `find_candidates` returns and `candidates.json` holds."""

    config: dict[str, Any]
    gallery: Gallery
    #: modality -> sampled query ids (image ids for i2t, caption ids for t2i), ascending.
    queries: dict[str, list[int]]
    #: One dict per candidate pair: modality, query_id, item_id, proposed_by {model: rank}.
    candidates: list[dict[str, Any]]
    #: modality -> str(query id) -> item ids in some model's top-`exclusion_depth`.
    exclude: dict[str, dict[str, list[int]]] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "format": "counterfactory-eccv-candidates/1",
            "config": self.config,
            "gallery": self.gallery.to_json(),
            "queries": self.queries,
            "candidates": self.candidates,
            "exclude": self.exclude,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Candidates:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise InputFileError(
                path,
                f"cannot read the candidates file ({err})",
                "pass the candidates.json written by `counterfactory eccv candidates`",
            ) from err
        if not isinstance(data, dict) or data.get("format") != "counterfactory-eccv-candidates/1":
            raise InputFileError(
                path,
                "is not a candidates file",
                "pass the candidates.json written by `counterfactory eccv candidates`",
            )
        return cls(
            config=data["config"],
            gallery=Gallery.from_json(data["gallery"]),
            queries=data["queries"],
            candidates=data["candidates"],
            exclude=data["exclude"],
        )


def default_cache_dir() -> Path:
    import os

    cache = os.environ.get("COUNTERFACTORY_CACHE") or Path.home() / ".cache" / "counterfactory"
    return Path(cache) / "eccv_embeddings"


def sample_queries(gallery: Gallery, n_images: int, n_captions: int, seed: int) -> dict[str, list[int]]:
    """Seeded sample without replacement, returned in ascending id order."""
    rng = np.random.default_rng(seed)
    out = {}
    for modality, ids, n in (("i2t", gallery.image_ids, n_images), ("t2i", gallery.caption_ids, n_captions)):
        if n > len(ids):
            log.warning("%s: %d queries asked, the gallery has %d: using all", modality, n, len(ids))
        picked = rng.choice(len(ids), size=min(n, len(ids)), replace=False)
        out[modality] = sorted(int(ids[i]) for i in picked)
    return out


class _Rows:
    """Selected rows of an embedding matrix, read one streamed chunk at a time (no full copy of a
    memory-mapped 600K-caption gallery)."""

    def __init__(self, emb: np.ndarray, rows: np.ndarray) -> None:
        self.emb, self.rows = emb, rows
        self.shape = (len(rows), emb.shape[1])

    def __getitem__(self, chunk: slice) -> np.ndarray:
        return np.asarray(self.emb[self.rows[chunk]])


def distinct_captions(caption_emb: np.ndarray, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the first caption of each distinct (text, vector), ascending, and for every
    gallery row the position of its distinct caption among them.

    A repeated caption text has the bitwise-same vector (embeddings.py embeds each text once),
    yet a blocked matrix product can round its scores differently at different gallery columns,
    so ties would not be exact. Scoring each distinct vector once makes them exact. Vectors are
    compared, not only texts, so embeddings from elsewhere are never merged wrongly."""
    first: dict[str, int] = {}
    rep = np.array([first.setdefault(t, n) for n, t in enumerate(texts)], dtype=np.int64)
    dup = np.flatnonzero(rep != np.arange(len(texts)))
    if len(dup):
        same = (np.asarray(caption_emb[dup]) == np.asarray(caption_emb[rep[dup]])).all(axis=1)
        rep[dup[~same]] = dup[~same]
    reps = np.flatnonzero(rep == np.arange(len(texts)))
    return reps, np.searchsorted(reps, rep)


def _topk_over_distinct(
    q: np.ndarray, caption_emb: np.ndarray, reps: np.ndarray, slot: np.ndarray, k: int
) -> np.ndarray:
    """Top-k gallery rows (ties: lower row) from the top-k distinct captions. Enough: an item
    outside them has k distinct captions ranked ahead, whose first rows all rank ahead of it."""
    from counterfactory_metrics.map_at_r.topk import topk_from_embeddings

    order = np.argsort(slot, kind="stable")  # gallery rows grouped by distinct caption, ascending
    members = np.split(order, np.cumsum(np.bincount(slot, minlength=len(reps)))[:-1])
    index, scores = topk_from_embeddings(q, _Rows(caption_emb, reps), min(k, len(reps)))
    out = np.empty((len(q), k), dtype=np.int64)
    for r, (slots, vals) in enumerate(zip(index, scores, strict=True)):
        rows = np.concatenate([members[s] for s in slots])
        row_scores = np.repeat(vals, [len(members[s]) for s in slots])
        out[r] = rows[np.lexsort((rows, -row_scores))[:k]]
    return out


def model_topk(
    image_emb: np.ndarray, caption_emb: np.ndarray, gallery: Gallery, queries: dict[str, list[int]], k: int
) -> dict[str, np.ndarray]:
    """Per modality, [n_queries x k] gallery ids of one model's top-k (ties: lower gallery index;
    identical captions tie exactly, see `distinct_captions`)."""
    from counterfactory_metrics.map_at_r.topk import topk_from_embeddings

    i2t_q = image_emb[[gallery.image_row[q] for q in queries["i2t"]]]
    t2i_q = caption_emb[[gallery.caption_row[q] for q in queries["t2i"]]]
    out = {}
    for modality, q, ids in (("i2t", i2t_q, gallery.caption_ids), ("t2i", t2i_q, gallery.image_ids)):
        n = min(k, len(ids))
        if len(q) == 0:
            out[modality] = np.empty((0, n), dtype=np.int64)
            continue
        if modality == "i2t":
            reps, slot = distinct_captions(caption_emb, gallery.captions)
            index = (
                _topk_over_distinct(q, caption_emb, reps, slot, n)
                if len(reps) < len(ids)
                else topk_from_embeddings(q, caption_emb, n)[0]
            )
        else:
            index = topk_from_embeddings(q, image_emb, n)[0]
        out[modality] = np.asarray(ids, dtype=np.int64)[index]
    return out


def reranks(head: str | None) -> bool:
    """Whether an annotator of this head (None: a CLIP) ranks by re-ranking a top k, not by embeddings."""
    return bool(head) and method_of(head) != CONTRASTIVE_METHOD


def first_stage_head(cfg: CandidatesConfig, heads: dict[str, str | None]) -> str | None:
    """The first stage's head (None: a CLIP), checked by the benchmark's rule (`check_first_stage`)."""
    crossed = [m for m, h in heads.items() if h and needs_first_stage(h)]
    if crossed and not cfg.first_stage:
        raise UserFacingError(
            f"--model {crossed[0]!r} is a cross-encoder: name the model whose top --rerank-k it re-ranks "
            "with --first-stage ID (a CLIP or a model with contrastive embeddings)"
        )
    if any(map(reranks, heads.values())) and cfg.rerank_k < cfg.exclusion_depth:
        raise UserFacingError(f"need --rerank-k ({cfg.rerank_k}) >= --exclusion-depth ({cfg.exclusion_depth})")
    if not cfg.first_stage:
        return None
    found = named_model(cfg.first_stage, "--first-stage")[1]
    check_first_stage(cfg.first_stage, found)
    return None if found.dual_encoder else found.architecture


def annotator_topk(model: str, heads: tuple, cfg: CandidatesConfig, round_: tuple, precision) -> dict:
    """One annotator's top-`exclusion_depth` per modality: by its embeddings (a CLIP's, FLAVA's
    contrastive ones), or its re-ranking of a first stage's top `rerank_k`: BLIP's own ITC, or
    the --first-stage model's embeddings for ViLT and BridgeTower's ITM head (cross_annotators.py).
    `heads`: the annotator's and the first stage's (None: a CLIP)."""
    gallery, queries, cache = round_
    head, first_head = heads
    first_stage = cfg.first_stage if head and needs_first_stage(head) else None
    own = first_head if first_stage else head
    embedded = gallery_embeddings(first_stage or model, gallery, cache, cfg.batch_size, precision, own)
    if not reranks(head):
        return model_topk(*embedded, gallery, queries, cfg.exclusion_depth)
    first = (embedded, model_topk(*embedded, gallery, queries, cfg.rerank_k))
    run = (precision, cfg.batch_size, cfg.rerank_k, first_stage)
    return reranked_topk(model, head, first, round_, cfg.exclusion_depth, run)


def find_candidates(cfg: CandidatesConfig) -> Candidates:
    if not cfg.models:
        raise UserFacingError("no machine annotator given: pass at least one --model ID")
    names = model_names({m: m for m in cfg.models})
    if len(set(names.values())) != len(cfg.models):  # also one folder spelled two ways
        raise UserFacingError(f"a --model is given twice ({list(cfg.models)}); give each once")
    if cfg.k < 1 or cfg.exclusion_depth < cfg.k:
        raise UserFacingError(f"need 1 <= --k ({cfg.k}) <= --exclusion-depth ({cfg.exclusion_depth})")
    if (cfg.coco_root is None) == (cfg.dataset is None):
        raise UserFacingError("give the gallery as --coco-root or as --dataset (exactly one)")
    heads = {model: check_annotator(model) for model in cfg.models}
    first_head = first_stage_head(cfg, heads)
    gallery = Gallery.from_coco(cfg.coco_root, cfg.splits) if cfg.coco_root else Gallery.from_dataset(cfg.dataset)
    queries = sample_queries(gallery, cfg.image_queries, cfg.caption_queries, cfg.seed)
    cache = (Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()).resolve()
    proposed: dict[tuple[str, int, int], dict[str, int]] = {}
    exclude: dict[str, dict[str, set[int]]] = {m: {} for m in MODALITIES}
    precision = worker_precision(cfg.dtype)
    for model in cfg.models:
        top = annotator_topk(model, (heads[model], first_head), cfg, (gallery, queries, cache), precision)
        for modality in MODALITIES:
            for query, row in zip(queries[modality], top[modality].tolist(), strict=True):
                exclude[modality].setdefault(str(query), set()).update(row)
                for rank, item in enumerate(row[: cfg.k], start=1):
                    proposed.setdefault((modality, query, item), {})[names[model]] = rank
    candidates = [
        {"modality": m, "query_id": q, "item_id": i, "proposed_by": by} for (m, q, i), by in sorted(proposed.items())
    ]
    n_raw = sum(len(by) for by in proposed.values())
    log.info("%d proposals by %d models -> %d unique candidate pairs", n_raw, len(cfg.models), len(candidates))
    first_stage = model_names({cfg.first_stage: cfg.first_stage})[cfg.first_stage] if cfg.first_stage else None
    # The cache actually used, absolute: `model-bias` reads the same embeddings from any folder.
    config = {
        **asdict(cfg),
        "models": list(names.values()),
        "splits": list(cfg.splits),
        "model_sources": {names[m]: m for m in cfg.models},
        "cache_dir": str(cache),
        "proposals": n_raw,
        "precision": precision.as_config(),
        "gallery_left_out": gallery.left_out,
        "rerankers": {names[m]: reranker_record(h, cfg.rerank_k, first_stage) for m, h in heads.items() if h},
    }
    return Candidates(
        config=config,
        gallery=gallery,
        queries=queries,
        candidates=candidates,
        exclude={m: {q: sorted(v) for q, v in e.items()} for m, e in exclude.items()},
    )
