"""Evaluation with the project's metrics, in the loop, at the end and for `--eval-only`.

Sets (each evaluated when its source is given):

- retrieval: the real test split (`--real-test-split`, the Karpathy 5K test for COCO), images x
  all their captions, 5 positives per image (i2t) and 1 per caption (t2i): R@1/5/10 on the whole
  split (COCO 5K) and the mean over five folds of 1,000 images (COCO 1K). On the COCO 5K test
  images the protocol is the standard one: their 25,000 captions of eccv_caption's
  `coco_test_ids.npy` (5 per image; COCO's few sixth and seventh captions are left out) and the
  1K folds of each 5,000 consecutive caption ids there (the order of the VSE++ / ECCV Caption
  evaluations), not the build's image-id order. Other splits of >= 5,000 images get folds of
  1,000 consecutive rows, which match no published protocol. `--eccv` adds the ECCV Caption
  suite (ECCV mAP@R / R-P / R@1, CxC) of `map_at_r`, and PMRP with `--coco-instances` (its
  plausible-match positives are computed from COCO's instances, zeta = 0); it is defined on the
  COCO 5K test split only, which is checked before training.
- odmap: ODmAP@k of the decorrelation build's `odmap_queries` against `odmap_gallery`
  (gallery class mentions from its `mentioned_classes`, streaming top-k).
- itm: ITM score deltas (G: the cosine similarity, a CLIP's logits_per_text with the report's
  `--clip-g`, or a cross-encoder's own ITM score: builders/models/cross_encoders.py) on the held-out counterfactual pairs
  (IR_c, TR_c: a `cf:` mixture's validation pairs, or every pair of `--counterfactuals-split`
  when the build is not mixed into training, training/mixtures.py) and on real test pairs
  against a random other pair (IR_r, TR_r: a seeded random derangement of the test images,
  `random_derangement(n, PAIR_SEED)` of the metric module, seed 0, recorded with the numbers).
- necessity: object necessity PN per removed class (training/necessity.py); x is the retrieval
  split's copy of the query's source image, so PN needs both sets: a dual encoder's embeddings
  (s their cosine mapped to [0, 1]), or a cross-encoder's match probability s of each pair
  (`necessity_s`, training/rerank.py, the report's scoring); either's `s_kind` in run.json
  (training/cross_training.py `necessity_record`); ViLT has none: one logged line.
- validation loss: the contrastive loss on the validation examples, in order.
- zeroshot, flickr30k: zero-shot classification with the CLIP prompt templates (`--zeroshot`)
  and Flickr30k R@K with the retrieval code above (`--flickr30k`), training/zeroshot.py.

The sets are read once, before training, by training/eval_data.py. The embeddings of the last
evaluation are saved (`embeddings.npz`) so any metric can be recomputed post hoc with the
evaluate modules.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from builders.engine.batching import ShrinkingBatches
from counterfactory_metrics.itm_score_deltas.deltas import itm_score_deltas
from counterfactory_metrics.odmap.odmap_scores import odmap_from_topk
from counterfactory_metrics.map_at_r.topk import stable_topk, topk_from_embeddings
from training.backends import CLIP_LOGITS
from training.eval_config import EvalConfig
from training.data import ExampleDataset, fixed_batches, make_loader, to_device
from training.eval_data import EvalData
from training.losses import contrastive_loss
from training.mixtures import ExampleSet
from training.necessity import has_necessity, necessity, own_necessity_values
from training.ranked_scores import SETS, has_two_stage, two_stage_matrix
from training.sources import DataInputError, column_values
from training.statistics import UnitScores
from training.unit_scores import (
    RETRIEVAL,
    delta_units,
    necessity_units,
    odmap_units,
    pair_clusters,
    real_partners,
    retrieval_units,
    zeroshot_units,
)

log = logging.getLogger(__name__)


def module_device(module) -> torch.device:
    """Where the model's weights are: evaluation encodes there (the loader yields CPU tensors)."""
    return next(module.parameters()).device


def _to_numpy(feats: list[torch.Tensor]) -> np.ndarray:
    """The features of every batch as float32 numpy, moved to the CPU once."""
    return torch.cat(feats).float().cpu().numpy() if feats else np.zeros((0, 0), np.float32)


@functools.cache
def _shrinking(stage: str, size: int) -> ShrinkingBatches:
    """One per stage and size in a process: a size that ran out of memory is not tried again at
    the next evaluation, and the size is logged once. An embedding does not depend on its batch."""
    return ShrinkingBatches(stage, size, hint="use a GPU with more memory")


class UndecodableImage(DataInputError):
    """An evaluation image whose bytes do not decode: which example (`origin` build, table row,
    column), so the caller can name the file it came from."""

    def __init__(self, origin: str, row: int, column: str, problem: str) -> None:
        super().__init__(
            f"{origin} row {row}, column {column!r}: the image cannot be decoded "
            f"({problem}); rebuild the dataset or re-download that shard"
        )
        self.origin, self.row, self.column, self.problem = origin, row, column, problem


def first_undecodable(examples: ExampleSet, start: int, page: int) -> UndecodableImage | None:
    """The first example from `start` on whose image does not decode (the builders' rule,
    loading_scripts/images.py), or None. The bytes are read `page` examples at a time, the
    failed batch first, through `ExampleDataset.image_bytes`: one Arrow gather per (table,
    column), never a `datasets` row read per image (~1.3 ms each under datasets 5.x, #44)."""
    from loading_scripts.images import ImageProblem, open_rgb_image

    reader = ExampleDataset(examples, transform=None, min_side=0)  # bytes only: nothing is transformed
    for first in range(start, len(examples), page):
        indices = list(range(first, min(first + page, len(examples))))
        for i, data in zip(indices, reader.image_bytes(indices), strict=True):
            try:
                open_rgb_image(data, name=f"row {examples.row[i]}").close()
            except ImageProblem as problem:
                return UndecodableImage(examples.origin[i], examples.row[i], examples.column[i], problem.reason)
    return None


@torch.no_grad()
def encode_images(module, backend, examples: ExampleSet, batch_size: int, workers: int) -> np.ndarray:
    """The images' embeddings; an image that does not decode is one line naming its row
    (`UndecodableImage`), found once the DataLoader failed (no image is decoded twice)."""
    loader = make_loader(examples, fixed_batches(len(examples), batch_size), backend, workers)
    device = module_device(module)
    batches = _shrinking("evaluation image encode", batch_size)
    feats: list[torch.Tensor] = []
    try:
        for b in loader:
            feats += batches.map(b["pixel_values"], lambda px: [module(pixel_values=px.to(device))[0]])
    except Exception:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError...: re-raised unless a row is bad
        bad = first_undecodable(examples, sum(len(f) for f in feats), batch_size)
        if bad is None:
            raise
        raise bad from None
    return _to_numpy(feats)


@torch.no_grad()
def encode_texts(module, backend, texts: list[str], batch_size: int) -> np.ndarray:
    """The texts' embeddings. Each distinct text is encoded once, in order of first appearance,
    and its row copied to its repeats: equal captions get equal embeddings by construction, and
    a caption shared by many rows (a counterfactual set's originals, a fixture's few strings)
    costs one encode. On distinct texts the batches are those of encoding every text."""
    device = module_device(module)
    first: dict[str, int] = {}
    rows = [first.setdefault(t, len(first)) for t in texts]
    emb = _to_numpy(
        _shrinking("evaluation text encode", batch_size).map(
            list(first), lambda chunk: [module(text=to_device(backend.tokenize(list(chunk)), device))[1]]
        )
    )
    return emb if len(first) == len(texts) else emb[rows]


def cf_texts(ex: ExampleSet) -> list[str]:
    """The captions of a counterfactual set's rows: caption_0 of the original, caption_1 of the
    counterfactual, pair after pair."""
    table = ex.tables[ex.table_of[0]]
    captions = [column_values(table, "caption_0"), column_values(table, "caption_1")]
    return [captions[i % 2][ex.row[i]] for i in range(len(ex))]


def image_reader(ex: ExampleSet):
    """`images(rows)`: the decoded images of `ex`'s rows, read a page at a time (a cross-encoder's
    processor transforms them); an image that does not decode is one line naming its row."""
    from training.data import decode_image

    reader = ExampleDataset(ex, transform=None, min_side=0)  # bytes only: the processor transforms

    def images(rows: list[int]) -> list:
        try:
            return [decode_image(b, lambda img: img.copy(), 0) for b in reader.image_bytes(rows)]
        except Exception:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError...: re-raised unless a row is bad
            bad = first_undecodable(ex, rows[0], len(rows))
            if bad is None:
                raise
            raise bad from None

    return images


def cross_encoder_scores(backend, data: EvalData, batch_size: int, workers: int = 0) -> dict[str, np.ndarray]:
    """A cross-encoder's (builders/models/cross_encoders.py) G of each counterfactual pair's three
    scores (`cf_g`, pairs x 3); the images are decoded as they are read, a page at a time. With a
    `ranker` (training/rerank.py, set by the report and the trainer), also its two-stage retrieval
    arrays, and PN's s where `data` holds the queries' x (`necessity_s`)."""
    from builders.models.cross_encoders import counterfactual_pair_scores

    out = {}
    if data.cf_pairs is not None:
        ex = data.cf_pairs
        out["cf_g"] = counterfactual_pair_scores(backend, image_reader(ex), cf_texts(ex), batch_size)
    ranker = getattr(backend, "ranker", None)
    if ranker is not None and ranker.scores(data):
        out.update(ranker(data, batch_size, workers))
    return out


def compute_embeddings(module, backend, data: EvalData, batch_size: int, workers: int) -> dict[str, np.ndarray]:
    """The embeddings every metric below needs (L2-normalised, float32); of a cross-encoder, its
    counterfactual pairs' G (`cross_encoder_scores`: it has no embeddings)."""
    if not backend.dual_encoder:
        return cross_encoder_scores(backend, data, batch_size, workers)
    emb: dict[str, np.ndarray] = {}
    if data.retrieval is not None:
        emb["image"] = encode_images(module, backend, data.retrieval, batch_size, workers)
        emb["text"] = encode_texts(module, backend, data.captions, batch_size)
    if data.queries is not None:
        emb["query_image"] = encode_images(module, backend, data.queries, batch_size, workers)
        emb["gallery_text"] = encode_texts(module, backend, data.gallery_captions, batch_size)
    if data.cf_pairs is not None:
        emb["cf_image"] = encode_images(module, backend, data.cf_pairs, batch_size, workers)
        emb["cf_text"] = encode_texts(module, backend, cf_texts(data.cf_pairs), batch_size)
    if backend.g_kind == CLIP_LOGITS:  # G = logits_per_text: the deltas are scaled by it
        emb["logit_scale"] = np.asarray([float(module.logit_scale().detach())], np.float32)
    return emb


def retrieval_metrics(emb, data: EvalData, k_values) -> dict[str, float]:
    """R@K both ways, whole split and COCO 1K folds (training/unit_scores.py, per image)."""
    return {name: u.value() for name, u in retrieval_units(emb, data, k_values).items()}


def eccv_metrics(emb, data: EvalData) -> dict[str, float]:
    """The ECCV Caption suite (ECCV mAP@R / R-P / R@1, CxC, COCO 1K/5K), and PMRP when
    `data.pm_positives` were read (`--coco-instances`)."""
    from counterfactory_metrics.map_at_r.eccv_suite import EccvAnnotations, EccvSuiteConfig, eccv_suite_from_similarity

    targets = ("eccv_map_at_r", "eccv_rprecision", "eccv_r1", "cxc_recalls", "coco_1k_recalls", "coco_5k_recalls")
    pm = data.pm_positives
    if pm is not None:
        targets += ("pmrp",)
    # load_eval_data checked the split is COCO 5K and kept its standard 25,000 captions, the
    # ones the suite is defined on.
    two_stage = has_two_stage(emb, "retrieval")  # a cross-encoder ranks each direction apart
    res = eccv_suite_from_similarity(
        two_stage_matrix(emb, "i2t") if two_stage else emb["image"] @ emb["text"].T,
        data.image_ids,
        data.caption_ids,
        EccvSuiteConfig(target_metrics=targets),
        EccvAnnotations.load(pm),
        two_stage_matrix(emb, "t2i") if two_stage else None,
    )
    return {f"eccv/{m}_{d}": float(v) for m, by_dir in res.items() for d, v in by_dir.items()}


def class_matrix(lists: list[list[str]], classes: list[str]) -> np.ndarray:
    column = {c: j for j, c in enumerate(classes)}
    out = np.zeros((len(lists), len(classes)), dtype=bool)
    for i, names in enumerate(lists):
        out[i, [column[c] for c in names]] = True
    return out


def odmap_classes(data: EvalData) -> list[str]:
    return sorted({c for group in (data.removed, data.present, data.gallery_mentions) for cs in group for c in cs})


def odmap_result(emb, data: EvalData, k_values):
    """The odmap module's result (overall and per query) for the k values the gallery allows."""
    k = min(max(k_values), len(data.gallery_captions))
    if has_two_stage(emb, "odmap"):
        top = stable_topk(two_stage_matrix(emb, "q2t"), k)
    else:
        top, _ = topk_from_embeddings(emb["query_image"], emb["gallery_text"], k)
    classes = odmap_classes(data)
    return odmap_from_topk(
        top,
        class_matrix(data.gallery_mentions, classes),
        class_matrix(data.removed, classes),
        class_matrix(data.present, classes),
        k_values=[v for v in k_values if v <= k],
    )


def odmap_metrics(emb, data: EvalData, k_values) -> dict[str, float]:
    return {f"odmap/{name}": v for name, v in odmap_result(emb, data, k_values).as_dict().items()}


def itm_inputs(emb, data: EvalData) -> dict[str, np.ndarray]:
    """Score arguments of `itm_score_deltas`: G = cosine similarity of the embeddings (times
    CLIP's logit scale where it was kept: its `logits_per_text`), or a cross-encoder's own G of
    each pair (`cf_g`, `cross_encoder_scores`)."""
    args: dict[str, np.ndarray] = {}
    if "cf_g" in emb:
        g = emb["cf_g"]
        args.update(g_cc_ics=g[:, 0], g_cc_ios=g[:, 1], g_co_ics=g[:, 2])
    if "cf_image" in emb:
        i0, i1 = emb["cf_image"][0::2], emb["cf_image"][1::2]
        c0, c1 = emb["cf_text"][0::2], emb["cf_text"][1::2]
        args.update(g_cc_ics=(c1 * i1).sum(1), g_cc_ios=(c1 * i0).sum(1), g_co_ics=(c0 * i1).sum(1))
    if "real_g" in emb:  # a cross-encoder's G of the same pairs (training/rerank.py)
        g = emb["real_g"]
        args.update(g_cr_ir=g[:, 0], g_cr_io=g[:, 1], g_co_ir=g[:, 2])
    if "image" in emb and len(data.image_ids) > 1:
        # Real pair (C_o, I_o) = image i with its first caption; (C_r, I_r) = a random other
        # image's (a seeded derangement: never itself, the same pairs for every model).
        img = emb["image"]
        cap = emb["text"][first_captions(data)]
        r = real_partners(len(img))
        args.update(g_cr_ir=(cap[r] * img[r]).sum(1), g_cr_io=(cap[r] * img).sum(1), g_co_ir=(cap * img[r]).sum(1))
    if "logit_scale" in emb:
        return {name: g * emb["logit_scale"][0] for name, g in args.items()}
    return args


def first_captions(data: EvalData) -> np.ndarray:
    """The caption row of each retrieval image's first caption, in image rows' order: the real
    pairs' C_o (`itm_inputs`)."""
    first = np.unique(data.caption_image, return_index=True)[1]
    return first[np.argsort(np.argsort(data.image_ids))]  # image row -> rank of its id


def ranks(emb: dict, which: str) -> bool:
    """Whether `emb` ranks set `which` (training/ranked_scores.py SETS): a dual encoder's
    embeddings or a cross-encoder's two-stage arrays."""
    return SETS[which][0] in emb or has_two_stage(emb, which)


def class_embeddings(encode_texts, classnames: list[str], templates) -> np.ndarray:
    """(classes, dim): per class the renormalised mean of its prompts' normalised embeddings
    (`encode_texts(list[str])` returns L2-normalised rows)."""
    prompts = [t(c) for c in classnames for t in templates]
    emb = encode_texts(prompts).reshape(len(classnames), len(templates), -1).mean(1)
    return emb / np.linalg.norm(emb, axis=1, keepdims=True)


def zeroshot_scores(image_emb: np.ndarray, class_emb: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Top-1 / top-5 accuracy and mean per-class recall of the nearest class embeddings."""
    logits = image_emb @ class_emb.T
    k = min(5, logits.shape[1])
    top = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    hit1 = top[:, 0] == labels
    out = {"top1": float(hit1.mean()), f"top{k}": float((top == labels[:, None]).any(1).mean())}
    present = np.unique(labels)
    out["mean_per_class_recall"] = float(np.mean([hit1[labels == c].mean() for c in present]))
    return out


def zeroshot_and_flickr30k(module, backend, data: EvalData, cfg: EvalConfig, emb: dict) -> dict[str, float]:
    """Flickr30k R@K (the COCO retrieval code, whole split) and each zero-shot set's accuracy;
    their embeddings are added to `emb`."""
    bs, workers = cfg.eval_batch_size, cfg.num_workers
    out: dict[str, float] = {}
    if data.flickr30k is not None:
        f = data.flickr30k
        flickr = {
            "image": encode_images(module, backend, f.retrieval, bs, workers),
            "text": encode_texts(module, backend, f.captions, bs),
        }
        emb.update({f"flickr30k_{k}": v for k, v in flickr.items()})
        out.update(
            {
                k.replace(f"{RETRIEVAL}/", "flickr30k/"): v
                for k, v in retrieval_metrics(flickr, f, cfg.k_values).items()
            }
        )
    for z in data.zeroshot:  # each set with its own templates (training/zeroshot.py)
        images = encode_images(module, backend, z.examples, bs, workers)
        classes = class_embeddings(lambda texts: encode_texts(module, backend, texts, bs), z.classnames, z.templates)
        emb[f"zeroshot_{z.name}_image"], emb[f"zeroshot_{z.name}_class"] = images, classes
        out.update({f"zeroshot/{z.name}/{k}": v for k, v in zeroshot_scores(images, classes, z.labels).items()})
    return out


def unit_scores(emb: dict[str, np.ndarray], data, k_values, retrieval: bool = True) -> dict[str, UnitScores]:
    """Every metric of `data` that has units (training/unit_scores.py), from the embeddings
    `evaluate_model` saved (without the COCO retrieval's when `retrieval` is False: the caller
    ranked them already)."""
    out: dict[str, UnitScores] = {}
    if ranks(emb, "retrieval") and retrieval:
        out.update(retrieval_units(emb, data, k_values))
    if ranks(emb, "odmap"):
        out.update(odmap_units(odmap_result(emb, data, k_values), data.removed, data.query_image_ids))
    if has_necessity(emb):
        values = own_necessity_values(emb, data)
        out.update(necessity_units(values, len(data.query_image_ids), data.query_image_ids))
    scores = itm_inputs(emb, data)
    if scores:
        out.update(delta_units(scores, pair_clusters(data.cf_pairs)))
    if data.flickr30k is not None and "flickr30k_image" in emb:
        flickr = {"image": emb["flickr30k_image"], "text": emb["flickr30k_text"]}
        out.update(
            {
                k.replace(RETRIEVAL, "flickr30k", 1): v
                for k, v in retrieval_units(flickr, data.flickr30k, k_values, units="flickr30k images").items()
            }
        )
    for z in data.zeroshot:
        if f"zeroshot_{z.name}_image" in emb:
            out.update(
                zeroshot_units(z.name, emb[f"zeroshot_{z.name}_image"], emb[f"zeroshot_{z.name}_class"], z.labels)
            )
    return out


@torch.no_grad()
def validation_loss(module, backend, examples: ExampleSet, batch_size: int, workers: int, loss: str = "clip") -> float:
    """The mean `--loss` (clip or siglip) over in-order batches of `examples`."""
    if not backend.dual_encoder:  # a cross-encoder's own objective (training/cross_training.py)
        return backend.validation_loss(module, examples, batch_size, workers)
    loader = make_loader(examples, fixed_batches(len(examples), batch_size), backend, workers)
    losses, sizes = [], []
    device = module_device(module)
    for b in loader:
        b = to_device(b, device)
        img, txt, _, *logit = module(
            pixel_values=b["pixel_values"], text=b["text"], **({"with_bias": True} if loss == "siglip" else {})
        )
        losses.append(float(contrastive_loss(loss, img, txt, *logit)))
        sizes.append(len(img))
    return float(np.average(losses, weights=sizes)) if losses else float("nan")


def evaluate_model(
    module, backend, data: EvalData, cfg: EvalConfig, save_to: Path | BinaryIO | None = None, units: dict | None = None
) -> dict[str, float]:
    """All metrics of `data`; with `save_to` (a path, or a file the caller opened: the trainer's
    run folder, training/run_root.py), also write the embeddings there; with `units`, also
    fill it with each metric's per-unit scores (training/unit_scores.py: what the intervals
    resample)."""
    was_training = module.training
    module.eval()
    bs, workers = cfg.eval_batch_size, cfg.num_workers
    emb = compute_embeddings(module, backend, data, bs, workers)
    metrics: dict[str, float] = {}
    per_image = {}
    if ranks(emb, "retrieval"):
        per_image = retrieval_units(emb, data, cfg.k_values)  # ranked once, for both
        metrics.update({name: u.value() for name, u in per_image.items()})
        if cfg.eccv:
            metrics.update(eccv_metrics(emb, data))
    if ranks(emb, "odmap"):
        metrics.update(odmap_metrics(emb, data, cfg.k_values))
    if has_necessity(emb):  # x is a retrieval image: encoded, or its pairs scored by a cross-encoder
        metrics.update(necessity(own_necessity_values(emb, data)))
    itm_args = itm_inputs(emb, data)
    if itm_args:
        for delta, stats in itm_score_deltas(**itm_args).items():
            metrics.update(
                {f"itm/{delta}_{k}": float(v) for k, v in stats.items() if k in ("mean", "median", "frac_below_zero")}
            )
    metrics.update(zeroshot_and_flickr30k(module, backend, data, cfg, emb))
    if data.validation is not None and len(data.validation):
        metrics["val_loss"] = validation_loss(module, backend, data.validation, bs, workers, cfg.loss)
    if units is not None:
        units.update({**per_image, **unit_scores(emb, data, cfg.k_values, retrieval=False)})
    if save_to is not None:
        np.savez(save_to, **emb, **{f"itm_{k}": v for k, v in itm_args.items()})
    module.train(was_training)
    return metrics
