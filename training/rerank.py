"""Retrieval by a cross-encoder (#51), each family as its own paper ranks, behind the backend
interface: `Ranker` gives the evaluation the arrays training/ranked_scores.py turns into the score
matrices the CLIP path already ranks (R@K, the ECCV suite, ODmAP), and the cross-encoder's G of
the real pairs (IR_r / TR_r).

Each family ranks as its own paper does (builders/models/cross_ranking.py, the copy the MITL
annotators share): BLIP re-ranks its ITC top k by ITM + ITC, FLAVA and BridgeTower's
contrastive head rank by their contrastive embeddings (k 0). BridgeTower's own retrieval
evaluation (microsoft/BridgeTower `src/modules/objectives.py`, `compute_irtr_itm_itc_recall`)
picks each query's ITC top k (`k_test`: 256 on COCO, 128 on Flickr30K, `src/config.py`) and ranks
them by the ITM head's `[:, 1]` alone: that is its ITM head as `--model` with its contrastive
head as `--first-stage` (below).

- BridgeTower's ITM head and ViLT have no dual encoder. ViLT's released evaluation
  (dandelin/ViLT `vilt/modules/objectives.py`, `compute_irtr_recall`) ranks every pair by its ITM
  head; here a first-stage model the user names (`--first-stage`, any CLIP the report loads; in
  the trainer's evaluation too, never trained) picks each query's top k by its cosine and the
  cross-encoder's G ranks them: with k the gallery size this is that full ranking. A first stage
  may also be a model with contrastive embeddings of its own (BLIP, FLAVA, BridgeTower's
  contrastive head): its embeddings pick the top k. Without a first stage they get no retrieval
  metric.

The candidates outside the top k rank below it in the first stage's order (ranked_scores.py).
Each distinct (image, caption) pair is scored once, in batches with progress and an ETA.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from builders.engine.provenance import model_name
from builders.models.cross_encoders import FIRST_STAGE_METHOD, score_pairs
from builders.models.cross_ranking import CONTRASTIVE_METHOD, OWN_FIRST_STAGE, itc_images, itc_texts
from builders.models.cross_ranking import check_first_stage, method_of, reranked_scores
from counterfactory_metrics.map_at_r.topk import stable_topk
from training.evaluation import encode_images, encode_texts, first_captions, image_reader
from training.necessity import CROSS_S, necessity_pairs, original_rows
from training.ranked_scores import SETS, first
from training.ranked_scores import tied_scores
from training.report.models import ModelSpec, load_model, parse_model, preprocessing_digest, weights_digest
from training.unit_scores import real_partners

log = logging.getLogger(__name__)
#: What the report and the trainer import from here; the ranking constants are cross_ranking.py's.
__all__ = [
    "FIRST_STAGE_METHOD",
    "OWN_FIRST_STAGE",
    "Ranker",
    "RankerSpec",
    "first_stage_spec",
    "load_first_stage",
    "method_of",
    "ranker",
]


@dataclass(frozen=True)
class RankerSpec:
    """What a cross-encoder's retrieval numbers depend on, as the records and the cache key say
    it: the method, k (0: no re-ranking), and the first-stage model (None: the model's own ITC)."""

    method: str
    k: int
    first_stage: str | None = None
    first_stage_digest: str | None = None

    def record(self) -> dict:
        return {"method": self.method, "k": self.k, "first_stage": self.first_stage}


class Ranker:
    """`ranker(data, batch, workers)`: a cross-encoder's two-stage retrieval arrays of `data`
    (ranked_scores.py; none when `spec` is None: no first stage to rank with) and its real pairs'
    G (`real_g`: G(C_r, I_r), G(C_r, I_o), G(C_o, I_r), evaluation.itm_inputs' three), and PN's
    s where `data` holds the queries and their x (`_necessity`), set on the backend as
    `backend.ranker` by the report and the trainer."""

    def __init__(self, backend, spec: RankerSpec | None, first_stage=None) -> None:
        self.backend, self.spec, self.first_stage = backend, spec, first_stage

    def scores(self, data) -> bool:
        """Whether `data` has anything this ranker scores."""
        real = data.retrieval is not None and len(data.retrieval) > 1
        ranked = self.spec is not None and (data.retrieval is not None or data.queries is not None)
        both = data.retrieval is not None and data.queries is not None  # PN's x and x' (`_necessity`)
        return real or ranked or both

    def key(self) -> dict:
        """The cache key's `retrieval` (training/report/cache.py): what the arrays depend on."""
        width = int(self._embed_texts(["a photo"], 1).shape[1])
        return {**self.spec.record(), "first_stage_digest": self.spec.first_stage_digest, "width": width}

    def __call__(self, data, batch: int, workers: int) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        if self.first_stage is not None:  # on the device the cross-encoder scores on
            self.first_stage.module.to(next(self.backend.module.parameters()).device)
        pairs, plans = PairPool(), []
        sets = {"retrieval": (data.retrieval, data.captions), "odmap": (data.queries, data.gallery_captions)}
        for which, (examples, texts) in sets.items() if self.spec is not None else ():
            if examples is not None:
                plans += self._candidates(which, examples, texts, (batch, workers), (out, pairs))
        if data.retrieval is not None and len(data.retrieval) > 1:
            plans.append(("real", None, self._real_pairs(pairs, data), 0.0))
        scores = pairs.score(self.backend, {"retrieval": data.retrieval, "odmap": data.queries}, batch)
        for direction, idx, keys, itc in plans:
            if idx is None:
                out["real_g"] = scores[keys].reshape(-1, 3)
            else:
                out[f"rr_{direction}_idx"] = idx.astype(np.int64)
                g = scores[keys].reshape(idx.shape)
                out[f"rr_{direction}_score"] = reranked_scores(self.spec.method, g, itc).astype(np.float32)
        return {**out, **self._necessity(data, batch)}

    def _necessity(self, data, batch: int) -> dict[str, np.ndarray]:
        """PN's s of `data`'s removal pairs (`necessity_s`) where it holds both the queries and the
        split of their source images (the trainer's evaluation; a report's build holds one); a
        model with no s (ViLT): none, said in one line."""
        if data.retrieval is None or data.queries is None:
            return {}
        if not self.backend.s_kind:
            say_no_necessity(self.backend.model_id, self.backend)
            return {}
        rows = original_rows(data.query_image_ids, data.image_ids)
        return {CROSS_S: necessity_s(self.backend, data.retrieval, data, rows, necessity_pairs(rows, data), batch)}

    def _candidates(self, which: str, examples, texts: list[str], sizes: tuple[int, int], into: tuple) -> list:
        """Each direction's top k of set `which` by the first stage, their pairs added to the pool,
        as (direction, candidates, pool keys, their first-stage similarity: BLIP adds its ITC's)."""
        out, pairs = into
        query, gallery, directions = SETS[which]
        images, captions = self._embed_images(examples, *sizes), self._embed_texts(texts, sizes[0])
        out[first(query)], out[first(gallery)] = images, captions
        sim = tied_scores(images, captions, texts)
        plans = []
        for direction in directions:
            matrix = np.ascontiguousarray(sim.T) if direction == "t2i" else sim
            k = min(self.spec.k, matrix.shape[1])
            idx = stable_topk(matrix, k) if k else np.zeros((len(matrix), 0), np.int64)
            own = np.broadcast_to(np.arange(len(matrix))[:, None], idx.shape)
            image_rows, text_cols = (idx, own) if direction == "t2i" else (own, idx)
            keys = pairs.add(which, image_rows.ravel(), [texts[c] for c in text_cols.ravel()])
            plans.append((direction, idx, keys, np.take_along_axis(matrix, idx, 1)))
        return plans

    def _real_pairs(self, pairs: PairPool, data) -> np.ndarray:
        """The pool keys of each real pair's three G: (C_r, I_r), (C_r, I_o), (C_o, I_r)."""
        cap = [data.captions[c] for c in first_captions(data)]
        r = real_partners(len(cap))
        rows = np.stack([r, np.arange(len(cap)), r], 1).ravel()
        texts = [t for i in range(len(cap)) for t in (cap[r[i]], cap[r[i]], cap[i])]
        return pairs.add("retrieval", rows, texts)

    def _embed_images(self, examples, batch: int, workers: int) -> np.ndarray:
        stage = self.first_stage or self.backend  # a dual encoder, or contrastive features of its own
        if stage.dual_encoder:
            return encode_images(stage.module, stage, examples, batch, workers)
        read = image_reader(examples)
        starts = range(0, len(examples), batch)
        return torch.cat(
            [itc_images(stage, read(list(range(s, min(s + batch, len(examples)))))) for s in starts]
        ).numpy()

    def _embed_texts(self, texts: list[str], batch: int) -> np.ndarray:
        stage = self.first_stage or self.backend
        if stage.dual_encoder:
            return encode_texts(stage.module, stage, texts, batch)
        distinct = list(dict.fromkeys(texts))
        emb = torch.cat([itc_texts(stage, distinct[s : s + batch]) for s in range(0, len(distinct), batch)])
        row = {t: i for i, t in enumerate(distinct)}
        return emb.numpy()[[row[t] for t in texts]]


class PairPool:
    """Distinct (set, image row, caption) pairs to score, each once whoever asks for it."""

    def __init__(self) -> None:
        self.index: dict[tuple[str, int, str], int] = {}

    def add(self, which: str, rows: np.ndarray, texts: list[str]) -> np.ndarray:
        return np.fromiter(
            (self.index.setdefault((which, int(r), t), len(self.index)) for r, t in zip(rows, texts, strict=True)),
            np.int64,
            len(texts),
        )

    def score(self, backend, examples: dict, batch: int, with_s: bool = False, what: str = "re-rank") -> np.ndarray:
        """G of every pair (`with_s`: G and s, pairs x 2), in pool order (`score_pairs`: sorted by
        image, `batch` pairs a forward call, with progress and an ETA); `examples`: each set's
        examples; `what`: the progress bar's."""
        readers = {which: image_reader(ex) for which, ex in examples.items() if ex is not None}

        def read(keys: list[tuple[str, int]]) -> list:
            decoded = {}
            for which in dict.fromkeys(w for w, _ in keys):
                rows = [r for w, r in keys if w == which]
                decoded.update({(which, r): img for r, img in zip(rows, readers[which](rows), strict=True)})
            return [decoded[key] for key in keys]

        # The pool's keys in insertion order are its indices 0, 1, ... (`add`).
        pairs = [((which, row), text) for which, row, text in self.index]
        return score_pairs(backend, pairs, read, batch, f"{what} pairs of {backend.model_id}", with_s)


def say_no_necessity(name: str, backend) -> None:
    """The one line for a model with no s (ViLT), the report's and the trainer's: no PN, with the
    head's own reason (`no_s`), its other metrics scored."""
    log.warning("%s: no object necessity PN: %s; its other metrics are scored", name, backend.module.no_s)


def necessity_s(backend, originals, data, rows: np.ndarray, pairs: list, batch: int) -> np.ndarray:
    """(pairs, 2): a cross-encoder's s(x, y) and s(x', y) (its `s_kind`) of each
    `necessity_pairs` pair (training/necessity.py) of `data`'s queries: x row `rows[q]` of
    `originals` (the split of their source images), x' query q, y gallery caption t; each
    distinct pair scored once (`PairPool`), in batches with progress and an ETA. The report's
    and the trainer's PN are scored here."""
    pool, q = PairPool(), np.asarray([q for q, _, _ in pairs], np.int64)
    texts = [data.gallery_captions[t] for _, t, _ in pairs]
    x, x_removed = pool.add("originals", rows[q], texts), pool.add("queries", q, texts)
    examples = {"originals": originals, "queries": data.queries}
    s = pool.score(backend, examples, batch, with_s=True, what="PN")[:, 1]
    return np.stack([s[x], s[x_removed]], 1)


def first_stage_spec(name: str) -> ModelSpec:
    """`--first-stage name` parsed and checked (`cross_ranking.check_first_stage`), before any
    data is read."""
    spec = parse_model(name, "--first-stage")
    check_first_stage(name, spec.family)
    return spec


def load_first_stage(spec: ModelSpec, trust_pickled_weights: bool = False) -> tuple:
    """The first-stage backend, in eval mode with no gradient (never trained: the trainer's
    evaluations before and after training rank the same candidates), its name and digests. It
    goes to the cross-encoder's device when it ranks (`Ranker.__call__`)."""
    backend = load_model(spec, trust_pickled_weights)
    backend.module.eval().requires_grad_(False)
    return backend, model_name(spec.name), weights_digest(backend.module) + "+" + preprocessing_digest(backend)


def ranker(backend, architecture: str, k: int, first_stage=None) -> Ranker:
    """The `Ranker` of cross-encoder `backend` (`architecture`: its scored head, config.json's):
    BLIP on its own ITC top k, FLAVA and BridgeTower's contrastive head by their contrastive
    embeddings alone (k 0), any other on the top k of `first_stage()` (`load_first_stage`'s
    three); without one, a ranker of the real pairs' G only."""
    method = method_of(architecture)
    if method != FIRST_STAGE_METHOD:
        return Ranker(backend, RankerSpec(method, 0 if method == CONTRASTIVE_METHOD else k))
    if first_stage is None:
        return Ranker(backend, None)
    loaded, name, digest = first_stage()
    return Ranker(backend, RankerSpec(method, k, name, digest), loaded)
