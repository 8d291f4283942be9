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
- itm: ITM score deltas (cosine similarity as the score G) on the held-out counterfactual pairs
  (IR_c, TR_c: a `cf:` mixture's validation pairs, or every pair of `--counterfactuals-split`
  when the build is not mixed into training, training/mixtures.py) and on real test pairs
  against a random other pair (IR_r, TR_r).
- necessity: per removed class, PN = (s(x, y) - s(x', y)) / s(x, y) with s = (cos + 1) / 2 in
  [0, 1], x the original image, x' the object-removal image and y an original caption of x that
  mentions the removed class (the model-agnostic reading of the NUIF paper's necessity). x is
  the retrieval split's embedding of the query's source image, so PN needs both sets.
- validation loss: the contrastive loss on the validation examples, in order.
- zeroshot, flickr30k: zero-shot classification with the CLIP prompt templates (`--zeroshot`)
  and Flickr30k R@K with the retrieval code above (`--flickr30k`), training/zeroshot.py.

The embeddings of the last evaluation are saved (`embeddings.npz`) so any metric can be recomputed
post hoc with the evaluate modules.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np
import torch

from builders.engine.batching import ShrinkingBatches
from counterfactory_metrics.itm_score_deltas.deltas import itm_score_deltas
from counterfactory_metrics.odmap.odmap_scores import odmap_from_topk
from counterfactory_metrics.map_at_r.topk import topk_from_embeddings
from counterfactory_metrics.map_at_r.retrieval import RetrievalMetricConfig, retrieval_scores_from_similarity
from training.config import TrainConfig
from training.data import fixed_batches, make_loader, to_device
from training.losses import contrastive_loss
from training.mixtures import ExampleSet, REAL_COLUMNS
from training.sources import DataInputError, open_table, resolve_commit
from training.zeroshot import class_embeddings, load_flickr30k, load_zeroshot_set, zeroshot_scores

log = logging.getLogger(__name__)

QUERY_COLUMNS = {"image": datasets.Image, "image_id": object, "removed_classes": object,
                 "present_classes": object, "caption_ids": object}
GALLERY_COLUMNS = {"caption_id": object, "caption": object, "mentioned_classes": object}
FOLD = 1000


@dataclass
class EvalData:
    """Everything evaluation reads, opened once."""

    retrieval: ExampleSet | None = None  # one example per test image (caption = its first)
    image_ids: np.ndarray | None = None
    caption_ids: np.ndarray | None = None
    captions: list[str] = field(default_factory=list)
    caption_image: np.ndarray | None = None  # image id of each caption
    folds: list[np.ndarray] = field(default_factory=list)  # rows of image_ids per COCO 1K fold
    queries: ExampleSet | None = None  # odmap queries (x')
    query_image_ids: np.ndarray | None = None  # COCO id of each query's source image x
    pm_positives: object = None  # PMRP's plausible matches (--coco-instances), map_at_r Positives
    removed: list[list[str]] = field(default_factory=list)
    present: list[list[str]] = field(default_factory=list)
    query_captions: list[list[int]] = field(default_factory=list)
    gallery_captions: list[str] = field(default_factory=list)
    gallery_ids: np.ndarray | None = None
    gallery_mentions: list[list[str]] = field(default_factory=list)
    cf_pairs: ExampleSet | None = None  # held-out pairs as rows (image_0, image_1) alternating
    validation: ExampleSet | None = None
    records: list = field(default_factory=list)
    zeroshot: list = field(default_factory=list)  # training.zeroshot.ZeroShotSet per --zeroshot
    flickr30k: EvalData | None = None  # its retrieval images and captions (--flickr30k)


def load_eval_data(cfg: TrainConfig, heldout_cf, cf_tables, validation) -> EvalData:
    d = cfg.data
    out = EvalData(validation=validation)
    if d.real is not None and d.real_test_split:
        test, record = open_table(d.real, "default", d.real_test_split, REAL_COLUMNS, resolve_commit(d.real))
        out.records.append(record)
        meta = test.select_columns(["image_id", "caption_ids", "captions"]).to_dict()
        out.retrieval = ExampleSet(tables=[test])
        for row, (caps) in enumerate(meta["captions"]):
            out.retrieval.add(0, row, "image", caps[0] if caps else "", None, -1, "real")
        out.image_ids = np.asarray(meta["image_id"], dtype=np.int64)
        out.caption_ids = np.asarray([c for ids in meta["caption_ids"] for c in ids], dtype=np.int64)
        out.captions = [c for caps in meta["captions"] for c in caps]
        out.caption_image = np.repeat(out.image_ids, [len(c) for c in meta["caption_ids"]])
        keep_standard_coco_captions(out)
        out.folds = retrieval_folds(out.image_ids)
        if cfg.run.eccv:
            check_eccv_split(out, f"{d.real.path} split {d.real_test_split!r}")
            if cfg.run.coco_instances:
                out.pm_positives = read_pm_positives(cfg.run.coco_instances)
    if d.decorrelation is not None:
        commit = resolve_commit(d.decorrelation)
        queries, rq = open_table(d.decorrelation, "odmap_queries", "test", QUERY_COLUMNS, commit)
        gallery, rg = open_table(d.decorrelation, "odmap_gallery", "test", GALLERY_COLUMNS, commit)
        out.records += [rq, rg]
        qm = queries.select_columns(["image_id", "removed_classes", "present_classes", "caption_ids"]).to_dict()
        out.query_image_ids = np.asarray(qm["image_id"], dtype=np.int64)
        out.queries = ExampleSet(tables=[queries])
        for row in range(len(queries)):
            out.queries.add(0, row, "image", "", None, -1, "decorrelation")
        out.removed, out.present, out.query_captions = qm["removed_classes"], qm["present_classes"], qm["caption_ids"]
        gm = gallery.select_columns(["caption_id", "caption", "mentioned_classes"]).to_dict()
        out.gallery_captions, out.gallery_mentions = gm["caption"], gm["mentioned_classes"]
        out.gallery_ids = np.asarray(gm["caption_id"], dtype=np.int64)
    if heldout_cf:
        out.cf_pairs = ExampleSet(tables=cf_tables)
        for table, row in heldout_cf:
            out.cf_pairs.add(table, row, "image_0", "", None, -1, "counterfactual")
            out.cf_pairs.add(table, row, "image_1", "", None, -1, "counterfactual")
    out.zeroshot = [load_zeroshot_set(spec, d.max_image_pixels) for spec in d.zeroshot]
    out.records += [z.record for z in out.zeroshot]
    if d.flickr30k:
        out.flickr30k = load_flickr30k(d.flickr30k, d.flickr30k_split)
        out.records += out.flickr30k.records
    return out


@functools.cache
def coco_5k_reference() -> tuple[np.ndarray, np.ndarray]:
    """The 25,000 COCO 5K test caption ids in eccv_caption's `coco_test_ids.npy` order (which
    defines the COCO 1K folds) and the image id owning each: (owners, captions). Read once per
    process: the protocol checks, the folds and the --eccv check all ask for it (callers must
    not modify the arrays)."""
    from counterfactory_metrics.map_at_r.eccv_annotations import coco_test_caption_ids, read_positives

    coco = read_positives("coco")
    captions = coco_test_caption_ids()
    owners = np.fromiter((coco.t2i[int(c)][0] for c in captions), dtype=np.int64, count=len(captions))
    return owners, captions


def is_coco_5k(image_ids: np.ndarray) -> bool:
    """Whether the split's images are exactly the COCO 5K test images."""
    return len(image_ids) == 5 * FOLD and \
        set(image_ids.tolist()) == set(coco_5k_reference()[0].tolist())


def keep_standard_coco_captions(data: EvalData) -> None:
    """On the COCO 5K test images, the 5-captions-per-image protocol: COCO has a sixth or
    seventh caption for a few test images, which the published 5K/1K numbers (and the ECCV
    suite) leave out. Other splits keep every caption."""
    if not is_coco_5k(data.image_ids):
        return
    keep = np.flatnonzero(np.isin(data.caption_ids, coco_5k_reference()[1]))
    data.caption_ids, data.caption_image = data.caption_ids[keep], data.caption_image[keep]
    if data.captions:
        data.captions = [data.captions[k] for k in keep]


def retrieval_folds(image_ids: np.ndarray) -> list[np.ndarray]:
    """Rows of `image_ids` in each COCO 1K fold (sorted, so ties rank as in the whole split);
    none for splits of fewer than 5,000 images."""
    if len(image_ids) < 5 * FOLD:
        return []
    if is_coco_5k(image_ids):
        owners, _ = coco_5k_reference()
        row = {int(i): r for r, i in enumerate(image_ids)}
        per_fold = len(owners) // 5
        fold_images = [dict.fromkeys(owners[f * per_fold:(f + 1) * per_fold].tolist()) for f in range(5)]
        return [np.sort([row[i] for i in images]) for images in fold_images]
    return [np.arange(f * FOLD, (f + 1) * FOLD) for f in range(5)]


def check_eccv_split(data: EvalData, where: str) -> None:
    """`--eccv` scores against eccv_caption's annotations of the COCO 5K test split: any other
    image set cannot be scored, so it is refused before training rather than after."""
    owners, captions = coco_5k_reference()
    images = set(owners.tolist())
    outside = sorted(set(data.image_ids.tolist()) - images)
    missing_images = images - set(data.image_ids.tolist())
    missing_captions = np.setdiff1d(captions, data.caption_ids)
    if outside or missing_images or len(missing_captions):
        raise DataInputError(
            f"--eccv needs the COCO 5K test split (Karpathy test: {len(images)} images, "
            f"{len(captions)} captions) as --real-test-split, but {where} has "
            f"{len(data.image_ids)} images ({len(outside)} outside it, e.g. {outside[:3]}; "
            f"{len(missing_images)} of its images and {len(missing_captions)} of its captions "
            "missing); pass a coco-captions build with the Karpathy test split or drop --eccv")


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


@torch.no_grad()
def encode_images(module, backend, examples: ExampleSet, batch_size: int, workers: int) -> np.ndarray:
    loader = make_loader(examples, fixed_batches(len(examples), batch_size), backend, workers)
    device = module_device(module)
    batches = _shrinking("evaluation image encode", batch_size)
    return _to_numpy([f for b in loader for f in batches.map(
        b["pixel_values"], lambda px: [module(pixel_values=px.to(device))[0]])])


@torch.no_grad()
def encode_texts(module, backend, texts: list[str], batch_size: int) -> np.ndarray:
    device = module_device(module)
    return _to_numpy(_shrinking("evaluation text encode", batch_size).map(
        texts, lambda chunk: [module(text=to_device(backend.tokenize(list(chunk)), device))[1]]))


def compute_embeddings(module, backend, data: EvalData, batch_size: int, workers: int) -> dict[str, np.ndarray]:
    """The embeddings every metric below needs (L2-normalised, float32)."""
    emb: dict[str, np.ndarray] = {}
    if data.retrieval is not None:
        emb["image"] = encode_images(module, backend, data.retrieval, batch_size, workers)
        emb["text"] = encode_texts(module, backend, data.captions, batch_size)
    if data.queries is not None:
        emb["query_image"] = encode_images(module, backend, data.queries, batch_size, workers)
        emb["gallery_text"] = encode_texts(module, backend, data.gallery_captions, batch_size)
    if data.cf_pairs is not None:
        ex = data.cf_pairs
        emb["cf_image"] = encode_images(module, backend, ex, batch_size, workers)
        meta = ex.tables[ex.table_of[0]].select_columns(["caption_0", "caption_1"])
        texts = [meta[ex.row[i]][f"caption_{i % 2}"] for i in range(len(ex))]
        emb["cf_text"] = encode_texts(module, backend, texts, batch_size)
    return emb


def retrieval_metrics(emb, data: EvalData, k_values) -> dict[str, float]:
    sim = emb["image"] @ emb["text"].T
    cfg = RetrievalMetricConfig(k_values=tuple(k_values), map_at_r=False, r_precision=False)
    out: dict[str, float] = {}
    for n, rows in enumerate([np.arange(len(data.image_ids)), *data.folds]):
        name = "retrieval" if n == 0 else "retrieval_1k"
        image_ids = data.image_ids[rows]
        cols = np.flatnonzero(np.isin(data.caption_image, image_ids))
        cap_ids, cap_image = data.caption_ids[cols], data.caption_image[cols]
        order = np.argsort(cap_image, kind="stable")
        owners, starts = np.unique(cap_image[order], return_index=True)
        by_image = dict(zip(owners.tolist(), (g.tolist() for g in np.split(cap_ids[order], starts[1:])), strict=True))
        i2t = {int(i): by_image.get(int(i), []) for i in image_ids}
        t2i = {int(c): [int(i)] for c, i in zip(cap_ids, cap_image, strict=True)}
        # The whole split needs no copy (5,000 x 25,000 floats is 500 MB).
        s = sim if n == 0 else sim[np.ix_(rows, cols)]
        for direction, matrix, pos, q, g in (("i2t", s, i2t, image_ids, data.caption_ids[cols]),
                                             ("t2i", s.T, t2i, data.caption_ids[cols], image_ids)):
            scores = retrieval_scores_from_similarity(matrix, pos, q, g, cfg)
            for k, v in scores.recall_at_k.items():
                out.setdefault(f"{name}/{direction}_R@{k}", []).append(v)
    return {k: float(np.mean(v)) for k, v in out.items()}


def read_pm_positives(instances: str):
    """PMRP's plausible-match positives of the COCO 5K test images (zeta = 0, as in the paper)
    from COCO's `instances_val2014.json`: read once, before training, so a wrong path fails
    first."""
    from counterfactory_metrics.map_at_r.eccv_annotations import (AnnotationFileError,
                                                                  pm_positives_from_instances, read_positives)

    try:
        return pm_positives_from_instances(Path(instances), read_positives("coco").i2t)
    except AnnotationFileError as err:
        raise DataInputError(f"--coco-instances: {err}") from None


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
    res = eccv_suite_from_similarity(emb["image"] @ emb["text"].T, data.image_ids,
                                     data.caption_ids, EccvSuiteConfig(target_metrics=targets),
                                     EccvAnnotations.load(pm))
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
    top, _ = topk_from_embeddings(emb["query_image"], emb["gallery_text"], k)
    classes = odmap_classes(data)
    return odmap_from_topk(top, class_matrix(data.gallery_mentions, classes),
                           class_matrix(data.removed, classes), class_matrix(data.present, classes),
                           k_values=[v for v in k_values if v <= k])


def odmap_metrics(emb, data: EvalData, k_values) -> dict[str, float]:
    return {f"odmap/{name}": v for name, v in odmap_result(emb, data, k_values).as_dict().items()}


def original_rows(query_image_ids: np.ndarray, image_ids: np.ndarray) -> np.ndarray:
    """Row of each query's source image x among the retrieval images (-1: not in that split)."""
    row = {int(i): r for r, i in enumerate(image_ids)}
    return np.asarray([row.get(int(i), -1) for i in query_image_ids], dtype=np.int64)


def necessity(original_images: np.ndarray, rows: np.ndarray, emb, data: EvalData) -> dict[str, float]:
    """PN per removed class (see the module docstring). `original_images`: the retrieval split's
    image embeddings, in which query q's x is row `rows[q]` (`original_rows`; -1: skipped)."""
    text_row = {int(c): i for i, c in enumerate(data.gallery_ids)}
    per_class: dict[str, list[float]] = {}
    for q, removed in enumerate(data.removed):
        if rows[q] < 0:
            continue
        for cap in data.query_captions[q]:
            t = text_row.get(int(cap))
            if t is None:
                continue
            s_x = (original_images[rows[q]] @ emb["gallery_text"][t] + 1) / 2
            s_xp = (emb["query_image"][q] @ emb["gallery_text"][t] + 1) / 2
            for c in set(removed) & set(data.gallery_mentions[t]):
                per_class.setdefault(c, []).append(float((s_x - s_xp) / s_x))
    out = {f"necessity/PN_{c}": float(np.mean(v)) for c, v in sorted(per_class.items())}
    if per_class:
        out["necessity/PN_mean"] = float(np.mean([v for vs in per_class.values() for v in vs]))
    return out


def itm_inputs(emb, data: EvalData) -> dict[str, np.ndarray]:
    """Score arguments of `itm_score_deltas` (G = cosine similarity)."""
    args: dict[str, np.ndarray] = {}
    if "cf_image" in emb:
        i0, i1 = emb["cf_image"][0::2], emb["cf_image"][1::2]
        c0, c1 = emb["cf_text"][0::2], emb["cf_text"][1::2]
        args.update(g_cc_ics=(c1 * i1).sum(1), g_cc_ios=(c1 * i0).sum(1), g_co_ics=(c0 * i1).sum(1))
    if "image" in emb and len(data.image_ids) > 1:
        # Real pair (C_o, I_o) = image i with its first caption; (C_r, I_r) = image i + 1's.
        first = np.unique(data.caption_image, return_index=True)[1]
        order = np.argsort(np.argsort(data.image_ids))  # image row -> rank of its id
        img = emb["image"]
        cap = emb["text"][first][order]
        r = np.roll(np.arange(len(img)), -1)
        args.update(g_cr_ir=(cap[r] * img[r]).sum(1), g_cr_io=(cap[r] * img).sum(1), g_co_ir=(cap * img[r]).sum(1))
    return args


def zeroshot_and_flickr30k(module, backend, data: EvalData, cfg: TrainConfig, emb: dict) -> dict[str, float]:
    """Flickr30k R@K (the COCO retrieval code, whole split) and each zero-shot set's accuracy;
    their embeddings are added to `emb`."""
    bs, workers = cfg.run.eval_batch_size, cfg.data.num_workers
    out: dict[str, float] = {}
    if data.flickr30k is not None:
        f = data.flickr30k
        flickr = {"image": encode_images(module, backend, f.retrieval, bs, workers),
                  "text": encode_texts(module, backend, f.captions, bs)}
        emb.update({f"flickr30k_{k}": v for k, v in flickr.items()})
        out.update({k.replace("retrieval/", "flickr30k/"): v
                    for k, v in retrieval_metrics(flickr, f, cfg.run.k_values).items()})
    for z in data.zeroshot:  # each set with its own templates (training/zeroshot.py)
        images = encode_images(module, backend, z.examples, bs, workers)
        classes = class_embeddings(lambda texts: encode_texts(module, backend, texts, bs), z.classnames,
                                   z.templates)
        emb[f"zeroshot_{z.name}_image"], emb[f"zeroshot_{z.name}_class"] = images, classes
        out.update({f"zeroshot/{z.name}/{k}": v for k, v in zeroshot_scores(images, classes, z.labels).items()})
    return out


@torch.no_grad()
def validation_loss(module, backend, examples: ExampleSet, batch_size: int, workers: int,
                    loss: str = "clip") -> float:
    """The mean `--loss` (clip or siglip) over in-order batches of `examples`."""
    loader = make_loader(examples, fixed_batches(len(examples), batch_size), backend, workers)
    losses, sizes = [], []
    device = module_device(module)
    for b in loader:
        b = to_device(b, device)
        img, txt, _, *logit = module(pixel_values=b["pixel_values"], text=b["text"],
                                     **({"with_bias": True} if loss == "siglip" else {}))
        losses.append(float(contrastive_loss(loss, img, txt, *logit)))
        sizes.append(len(img))
    return float(np.average(losses, weights=sizes)) if losses else float("nan")


def evaluate_model(module, backend, data: EvalData, cfg: TrainConfig, save_to: Path | None = None) -> dict[str, float]:
    """All metrics of `data`; with `save_to`, also write the embeddings there."""
    was_training = module.training
    module.eval()
    bs, workers = cfg.run.eval_batch_size, cfg.data.num_workers
    emb = compute_embeddings(module, backend, data, bs, workers)
    metrics: dict[str, float] = {}
    if "image" in emb:
        metrics.update(retrieval_metrics(emb, data, cfg.run.k_values))
        if cfg.run.eccv:
            metrics.update(eccv_metrics(emb, data))
    if "query_image" in emb:
        metrics.update(odmap_metrics(emb, data, cfg.run.k_values))
        if "image" in emb:  # x is a retrieval image, already encoded
            rows = original_rows(data.query_image_ids, data.image_ids)
            metrics.update(necessity(emb["image"], rows, emb, data))
    itm_args = itm_inputs(emb, data)
    if itm_args:
        for delta, stats in itm_score_deltas(**itm_args).items():
            metrics.update({f"itm/{delta}_{k}": float(v) for k, v in stats.items()
                            if k in ("mean", "median", "frac_below_zero")})
    metrics.update(zeroshot_and_flickr30k(module, backend, data, cfg, emb))
    if data.validation is not None and len(data.validation):
        metrics["val_loss"] = validation_loss(module, backend, data.validation, bs, workers, cfg.optim.loss)
    if save_to is not None:
        np.savez(save_to, **emb, **{f"itm_{k}": v for k, v in itm_args.items()})
    module.train(was_training)
    return metrics
