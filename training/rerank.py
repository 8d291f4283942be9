"""Retrieval by a cross-encoder (#51), each family as its own paper ranks, behind the backend
interface: `Ranker` gives the evaluation the arrays training/ranked_scores.py turns into the score
matrices the CLIP path already ranks (R@K, the ECCV suite, ODmAP), and the cross-encoder's G of
the real pairs (IR_r / TR_r).

- BLIP (`BlipForImageTextRetrieval`): its ITC similarity (the cosine of its projected [CLS]
  features, the model's `use_itm_head=False` output) picks each query's top k, which are ranked by
  ITM logit + ITC similarity, as BLIP's released evaluation adds them (salesforce/BLIP
  `train_retrieval.py`, `evaluation`: `score_matrix_i2t[i, topk_idx] = itm_head(...)[:, 1] +
  topk_sim`, and likewise t2i); k = 256, its COCO config's `k_test` (`configs/retrieval_coco.yaml`).
- FLAVA (`FlavaForPreTraining`): zero-shot retrieval by its contrastive embeddings alone (the
  cosine of the projected image and text [CLS] states), as FLAVA's paper (Singh et al. 2022,
  zero-shot retrieval) and its released example (facebookresearch/multimodal
  `examples/flava/coco_zero_shot.py`) rank; no ITM re-ranking, so k is 0.
- BridgeTower's ITM head and ViLT have no dual encoder. ViLT's released evaluation
  (dandelin/ViLT `vilt/modules/objectives.py`, `compute_irtr_recall`) ranks every pair by its ITM
  head; here a first-stage model the user names (`--first-stage`, any CLIP the report loads)
  picks each query's top k by its cosine and the cross-encoder's G ranks them: with k the gallery
  size this is that full ranking. Without a first stage they get no retrieval metric.

The candidates outside the top k rank below it in the first stage's order (ranked_scores.py).
Each distinct (image, caption) pair is scored once, in batches with progress and an ETA.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from builders.models.cross_encoders import FIRST_STAGE_METHOD, score_pairs
from counterfactory_metrics.map_at_r.topk import stable_topk
from builders.models.rgb import TransformersRGB
from training.evaluation import encode_images, encode_texts, first_captions, image_reader
from training.ranked_scores import SETS, first
from training.ranked_scores import tied_scores
from training.unit_scores import real_partners

log = logging.getLogger(__name__)

#: BLIP's COCO retrieval `k_test` (salesforce/BLIP configs/retrieval_coco.yaml): the default k.
DEFAULT_K = 256
#: architecture -> how it ranks (the records' `retrieval.method`).
BLIP_METHOD = "itc_top_k_reranked_by_itm_plus_itc"
FLAVA_METHOD = "contrastive"
OWN_FIRST_STAGE = {"BlipForImageTextRetrieval": BLIP_METHOD, "FlavaForPreTraining": FLAVA_METHOD}


def method_of(architecture: str) -> str:
    return OWN_FIRST_STAGE.get(architecture, FIRST_STAGE_METHOD)


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


@torch.no_grad()
def itc_images(backend, images: list) -> torch.Tensor:
    """BLIP's or FLAVA's normalised contrastive image features (see the module docstring)."""
    model, rgb = backend.module.model, TransformersRGB()
    px = backend.processor.image_processor(images=[rgb(i) for i in images], return_tensors="pt")["pixel_values"]
    px = px.to(next(model.parameters()).device)
    if hasattr(model, "flava"):
        feats = model.flava.image_projection(model.flava.image_model(pixel_values=px).last_hidden_state[:, 0])
    else:
        feats = model.vision_proj(model.vision_model(pixel_values=px).last_hidden_state[:, 0])
    return F.normalize(feats, dim=-1).float().cpu()


@torch.no_grad()
def itc_texts(backend, texts: list[str]) -> torch.Tensor:
    """BLIP's or FLAVA's normalised contrastive text features."""
    model = backend.module.model
    tok = backend.processor.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    tok = {k: v.to(next(model.parameters()).device) for k, v in tok.items()}
    if hasattr(model, "flava"):
        feats = model.flava.text_projection(model.flava.text_model(**tok).last_hidden_state[:, 0])
    else:
        out = model.text_encoder(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"])
        feats = model.text_proj(out.last_hidden_state[:, 0])
    return F.normalize(feats, dim=-1).float().cpu()


class Ranker:
    """`ranker(data, batch, workers)`: a cross-encoder's two-stage retrieval arrays of `data`
    (ranked_scores.py; none when `spec` is None: no first stage to rank with) and its real pairs'
    G (`real_g`: G(C_r, I_r), G(C_r, I_o), G(C_o, I_r), evaluation.itm_inputs' three), set on
    the backend as `backend.ranker` by the report."""

    def __init__(self, backend, spec: RankerSpec | None, first_stage=None) -> None:
        self.backend, self.spec, self.first_stage = backend, spec, first_stage

    def scores(self, data) -> bool:
        """Whether `data` has anything this ranker scores."""
        real = data.retrieval is not None and len(data.retrieval) > 1
        return real or (self.spec is not None and (data.retrieval is not None or data.queries is not None))

    def key(self) -> dict:
        """The cache key's `retrieval` (training/report/cache.py): what the arrays depend on."""
        width = int(self._embed_texts(["a photo"], 1).shape[1])
        return {**self.spec.record(), "first_stage_digest": self.spec.first_stage_digest, "width": width}

    def __call__(self, data, batch: int, workers: int) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        pairs, plans = PairPool(), []
        sets = {"retrieval": (data.retrieval, data.captions), "odmap": (data.queries, data.gallery_captions)}
        for which, (examples, texts) in sets.items() if self.spec is not None else ():
            if examples is not None:
                plans += self._candidates(which, examples, texts, (batch, workers), (out, pairs))
        if data.retrieval is not None and len(data.retrieval) > 1:
            plans.append(("real", None, self._real_pairs(pairs, data), 0.0))
        scores = pairs.score(self.backend, {"retrieval": data.retrieval, "odmap": data.queries}, batch)
        for direction, idx, keys, bonus in plans:
            if idx is None:
                out["real_g"] = scores[keys].reshape(-1, 3)
            else:
                out[f"rr_{direction}_idx"] = idx.astype(np.int64)
                out[f"rr_{direction}_score"] = (scores[keys].reshape(idx.shape) + bonus).astype(np.float32)
        return out

    def _candidates(self, which: str, examples, texts: list[str], sizes: tuple[int, int], into: tuple) -> list:
        """Each direction's top k of set `which` by the first stage, their pairs added to the pool,
        as (direction, candidates, pool keys, what BLIP adds to G: the ITC similarity)."""
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
            bonus = np.take_along_axis(matrix, idx, 1) if self.spec.method == BLIP_METHOD else 0.0
            plans.append((direction, idx, keys, bonus))
        return plans

    def _real_pairs(self, pairs: PairPool, data) -> np.ndarray:
        """The pool keys of each real pair's three G: (C_r, I_r), (C_r, I_o), (C_o, I_r)."""
        cap = [data.captions[c] for c in first_captions(data)]
        r = real_partners(len(cap))
        rows = np.stack([r, np.arange(len(cap)), r], 1).ravel()
        texts = [t for i in range(len(cap)) for t in (cap[r[i]], cap[r[i]], cap[i])]
        return pairs.add("retrieval", rows, texts)

    def _embed_images(self, examples, batch: int, workers: int) -> np.ndarray:
        if self.first_stage is not None:
            return encode_images(self.first_stage.module, self.first_stage, examples, batch, workers)
        read = image_reader(examples)
        starts = range(0, len(examples), batch)
        return torch.cat(
            [itc_images(self.backend, read(list(range(s, min(s + batch, len(examples)))))) for s in starts]
        ).numpy()

    def _embed_texts(self, texts: list[str], batch: int) -> np.ndarray:
        if self.first_stage is not None:
            return encode_texts(self.first_stage.module, self.first_stage, texts, batch)
        distinct = list(dict.fromkeys(texts))
        emb = torch.cat([itc_texts(self.backend, distinct[s : s + batch]) for s in range(0, len(distinct), batch)])
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


def ranker(backend, spec, k: int, first_stage=None) -> Ranker:
    """The `Ranker` of cross-encoder `backend` (`spec`: its --model, training/report/models.py):
    BLIP on its own ITC top k, FLAVA by its contrastive embeddings alone (k 0), any other on the
    top k of `first_stage()` (the loaded first-stage backend, its name and digests); without one,
    a ranker of the real pairs' G only."""
    method = method_of(spec.family.architecture)
    if method != FIRST_STAGE_METHOD:
        return Ranker(backend, RankerSpec(method, 0 if method == FLAVA_METHOD else k))
    if first_stage is None:
        return Ranker(backend, None)
    loaded, name, digest = first_stage()
    return Ranker(backend, RankerSpec(method, k, name, digest), loaded)
