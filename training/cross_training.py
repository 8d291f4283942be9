"""The trainer's side of a cross-encoder (BLIP, BridgeTower): the backend it trains, its step and its
validation loss; the loop, data, checkpoints and evaluation are the CLIP trainer's
(training/trainer.py). The objectives are training/itm_objectives.py.

The family is read from the checkpoint's `config.json` (builders/models/families.py); `--backend
blip|bridgetower` asks for one and is refused beside a checkpoint of another family. The model is
the scoring adapter's (builders/models/cross_encoders.py) with a training forward, so the evaluation
scores G with the weights being trained, and the final model is a `save_pretrained` folder of the
same class (with its processor), which `counterfactory benchmark --model` scores.

Training batches go through the trainer's DataLoader (pair-aware sampler, uint8 pixels, per-batch
normalisation) with the family's processor steps: BLIP's resize to its square size (bicubic), and
BridgeTower's shorter-side resize (rounded to its size divisor, longer side capped) and centre
crop, each after transformers' RGB conversion. Evaluation scores through the processor itself.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import numpy as np
import torch
from PIL import Image
from torchvision import transforms

from builders.engine.errors import UserFacingError
from builders.models.clip_ids import TRANSFORMERS, ClipId
from builders.models.families import named_model
from builders.models.rgb import TransformersRGB
from training.backends import Backend, FloorCenterCrop, HFTokenize, PixelPipeline, load_backend
from builders.models.cross_encoders import CrossEncoderBackend, load_cross_encoder
from training.data import fixed_batches, make_loader, to_device
from training.itm_objectives import GLOBAL_TERMS, TERMS, TRAINABLE
from training.losses import resolve_loss

log = logging.getLogger(__name__)

#: `--backend` of a cross-encoder -> the config's `model_type`.
CROSS_BACKENDS = {"blip": "blip", "bridgetower": "bridgetower"}


class BridgeTowerResize:
    """BridgeTower's image processor resize (`get_resize_output_image_size`): the shorter side to
    `size`, the longer side capped at 1333/800 x `size`, both rounded down to `divisor`."""

    def __init__(self, size: int, divisor: int) -> None:
        self.size, self.divisor = size, divisor

    def __call__(self, img: Image.Image) -> Image.Image:
        from transformers.models.bridgetower.image_processing_bridgetower import get_resize_output_image_size

        h, w = get_resize_output_image_size(
            np.zeros((3, img.height, img.width), np.uint8), self.size, int(1333 / 800 * self.size), self.divisor
        )
        return img.resize((w, h), Image.Resampling.BICUBIC)


def family_pixels(ip, model_type: str) -> PixelPipeline:
    """The family's image processor as the trainer's two-half pipeline (training/backends.py)."""
    mean, std = tuple(ip.image_mean), tuple(ip.image_std)
    if model_type == "blip":
        h, w = ip.size["height"], ip.size["width"]
        resize = transforms.Resize((h, w), interpolation=transforms.InterpolationMode.BICUBIC)
        return PixelPipeline(min(h, w), mean, std, (TransformersRGB(), resize))
    size, crop = ip.size["shortest_edge"], ip.crop_size["shortest_edge"]
    steps = (TransformersRGB(), BridgeTowerResize(size, ip.size_divisor), FloorCenterCrop(crop))
    return PixelPipeline(crop, mean, std, steps)


class CrossEncoderTraining(CrossEncoderBackend, Backend):
    """A cross-encoder the trainer trains: the scoring backend (`score`, `inputs`, `g_kind`,
    `dual_encoder` False) with the CLIP backend's training parts (pixels, tokenizer, freezing,
    checkpointing); saved as `save_pretrained` with its processor."""

    has_logit_bias = False

    def __init__(self, clip: ClipId, module, processor, model_type: str, architecture: str) -> None:
        Backend.__init__(self, clip, module, family_pixels(processor.image_processor, model_type), None, processor)
        CrossEncoderBackend.__init__(self, clip, module, processor)
        self.tokenize = HFTokenize(processor.tokenizer)
        self.objective = module.objective
        self.family, self.architecture = model_type, architecture

    def save(self, module, out) -> None:
        out.mkdir(parents=True, exist_ok=True)
        module.model.save_pretrained(out)
        self.processor.save_pretrained(out)

    def validation_loss(self, module, examples, batch_size: int, workers: int) -> float:
        """The evaluation's validation loss (`cross_validation_loss`), asked of the backend."""
        return cross_validation_loss(module, self, examples, batch_size, workers)

    def record(self) -> dict:
        """run.json's `objective`: the loss, each term's weight, and what the family samples."""
        return {"name": self.objective, "weights": TERMS[self.objective], "hard_negatives_per_row": 1}


def load_training_backend(clip: ClipId, asked: str = TRANSFORMERS, run=None) -> Backend:
    """The backend `clip` trains with: CLIP / open_clip (training/backends.py), or a BLIP or
    BridgeTower retrieval checkpoint (its family from config.json), checked against `asked`
    (`--backend`). With `run` (the trainer's RunConfig): its --eval-only also loads a ViLT or FLAVA
    one, scored and never trained, and its --first-stage is parsed and checked before any weight
    loads, passed on to the evaluation's ranker as the cross-encoder's `first_stage` (a ModelSpec
    or None; `trainer_ranker`)."""
    first, eval_only = (run.first_stage, run.eval_only) if run else (None, False)
    if clip.backend != TRANSFORMERS:
        _check_first_stage(first, clip.label, None)
        return load_backend(clip)
    found = named_model(clip.name)[1]  # the benchmark's parse and its one line for a model of no family
    first_stage = _check_first_stage(first, clip.label, found)
    want = CROSS_BACKENDS.get(asked)
    if want is not None and found.family.model_type != want:
        raise UserFacingError(
            f"--backend {asked} trains a {want} checkpoint, but --model {clip.label} is "
            f"{found.family.name} ({found.architecture}); give a {want} checkpoint or its --backend"
        )
    if found.dual_encoder:
        return load_backend(clip)
    trained = next((a for a in TRAINABLE if a in found.family.heads), None)
    if trained and not eval_only:  # the family's retrieval head, whichever head config.json names
        found = dataclasses.replace(found, architecture=trained)  # (-itm-mlm-itc's: the contrastive one)
    if found.architecture not in TRAINABLE and not eval_only:
        raise UserFacingError(
            f"--model {clip.label} is {found.family.name} ({found.architecture}): counterfactory train "
            f"finetunes CLIP, open_clip, BLIP and BridgeTower ({', '.join(TRAINABLE)}); score it with --eval-only"
        )
    from builders.models.loaders import load_image_text_model

    if found.architecture not in TRAINABLE:
        backend = ScoredCrossEncoder(load_cross_encoder(clip, found.architecture), found.architecture)
    else:
        model, processor = load_image_text_model(clip.name, found.architecture)
        module = TRAINABLE[found.architecture](model.train())
        backend = CrossEncoderTraining(clip, module, processor, found.family.model_type, found.architecture)
    backend.first_stage = first_stage
    return backend


class ScoredCrossEncoder(CrossEncoderBackend):
    """A cross-encoder `--eval-only` scores and the trainer does not train (ViLT, FLAVA): the
    report's adapter (builders/models/cross_encoders.py), with nothing to freeze, no objective
    and so no validation loss."""

    objective = None

    def __init__(self, scored: CrossEncoderBackend, architecture: str) -> None:
        super().__init__(scored.clip, scored.module, scored.processor)
        self.architecture = architecture

    def freeze(self, lock_image: bool, lock_text: bool) -> None:
        """Nothing is trained."""

    def enable_grad_checkpointing(self) -> None:
        """Nothing is trained."""

    def validation_loss(self, module, examples, batch_size: int, workers: int) -> float:
        log.warning("--model %s has no training objective here: its validation loss is NaN", self.model_id)
        return float("nan")


def _check_first_stage(name: str | None, label: str, found):
    """--first-stage against the model's family (`found`; None: open_clip): only a cross-encoder
    without a contrastive head of its own re-ranks one, and it is a model with embeddings; its
    ModelSpec (`first_stage_spec`), None without one."""
    from training.rerank import FIRST_STAGE_METHOD, first_stage_spec, method_of

    if not name:
        return None
    if found is None or found.dual_encoder or method_of(found.architecture) != FIRST_STAGE_METHOD:
        how = "its own embeddings" if found is None or found.dual_encoder else "its own contrastive head"
        raise UserFacingError(
            f"--first-stage picks the candidates of a cross-encoder without a contrastive head; --model {label} "
            f"ranks by {how}: drop --first-stage"
        )
    return first_stage_spec(name)


def trainer_ranker(backend, run):
    """The evaluation's retrieval by the cross-encoder (training/rerank.py, the code and flags
    `counterfactory benchmark` ranks with): BLIP's ITC top --rerank-k re-ranked by ITM + ITC,
    FLAVA's contrastive ranking, and an ITM model with no contrastive head (BridgeTower's, ViLT)
    re-ranking the top --rerank-k of its `first_stage` (`load_training_backend`'s parse of
    --first-stage: a CLIP, or a model's own contrastive head), loaded once and never trained;
    without one, its real pairs' G only, said in one line."""
    from training.rerank import FIRST_STAGE_METHOD, load_first_stage, method_of, ranker

    if backend.first_stage:
        first = functools.partial(load_first_stage, backend.first_stage, run.trust_pickled_weights)
        return ranker(backend, backend.architecture, run.rerank_k, first)
    if method_of(backend.architecture) == FIRST_STAGE_METHOD:
        log.warning(
            "--model %s (%s) has no first stage: no retrieval metrics (R@K, ODmAP), the ITM deltas "
            "still run; give --first-stage MODEL (a CLIP or a contrastive head whose top --rerank-k it re-ranks)",
            backend.model_id,
            backend.architecture,
        )
    return ranker(backend, backend.architecture, run.rerank_k)


def check_cross_options(cfg) -> None:
    """What the cross-encoder objectives do not take, refused before any data is read."""
    o, d = cfg.optim, cfg.data
    if o.loss is not None:
        raise UserFacingError(
            f"--loss {o.loss} is a dual encoder's contrastive loss; a cross-encoder trains with its "
            "family's objective (docs/training.md): leave --loss out"
        )
    if o.grad_accum > 1:
        raise UserFacingError(
            "--grad-accum > 1 is not supported for BLIP / BridgeTower: the hard negatives are drawn "
            "from the whole batch; give the batch as --batch-size"
        )
    if d.hard_negatives == "negclip":
        raise UserFacingError(
            "--hard-negatives negclip adds text columns to a contrastive loss; BLIP / BridgeTower draw "
            "their own hard negatives for image-text matching: use --hard-negatives pairs or none"
        )


def resolve_objective(cfg, backend) -> dict:
    """Set `cfg.optim.loss` to what the model trains with: a dual encoder's `--loss` as the model
    was trained (training/losses.py), a cross-encoder's family objective (its options checked),
    and a cross-encoder's ranker (`trainer_ranker`); the run record's `objective`, `retrieval`
    (method, k, first stage: the benchmark's records') and `first_stage` (its weights, never
    trained) and `necessity` (`necessity_record`) entries (a dual encoder's `necessity` only)."""
    if backend.dual_encoder:
        cfg.optim.loss = resolve_loss(cfg.optim.loss, backend.has_logit_bias, backend.model_id)
        return necessity_record(backend, cfg.data)
    check_cross_options(cfg)
    cfg.optim.loss = backend.objective
    backend.ranker = trainer_ranker(backend, cfg.run)
    spec = backend.ranker.spec
    first = spec and spec.first_stage and {"model": spec.first_stage, "digest": spec.first_stage_digest}
    return {
        "objective": backend.record() if backend.objective else None,
        "retrieval": spec.record() if spec else None,
        **({"first_stage": {**first, "trained": False}} if first else {}),
        **necessity_record(backend, cfg.data),
    }


def necessity_record(backend, data) -> dict:
    """run.json's `necessity`, where the run's evaluation gives PN (`data`, the run's data config,
    names both the retrieval split, x, and the decorrelation build, x': training/eval_data.py):
    PN's s (`s_kind` as the benchmark's PN records say it), or why the model has none (`no_pn`)."""
    if not (data.real is not None and data.real_test_split and data.decorrelation is not None):
        return {}
    if backend.dual_encoder or backend.s_kind:
        return {"necessity": {"s_kind": backend.s_kind}}
    return {"necessity": {"s_kind": None, "no_pn": backend.module.no_s}}


def step_seed(seed: int, step: int, process: int) -> int:
    """The seed of one step's negative draws: (run seed, step, process), never the global RNG."""
    return (seed * 1_000_003 + step) * 1_009 + process


def cross_encoder_step(model, batch: dict, accelerator, backend, seed: int) -> dict[str, float]:
    """Forward and backward of the family objective on one batch; the loss and each term. A term
    of the gathered batch (`GLOBAL_TERMS`) is multiplied by the process count before backward, as
    the CLIP loss (DDP averages gradients); a term of the process's own batch is not."""
    weights = TERMS[backend.objective]
    with accelerator.autocast():
        terms = model(
            pixel_values=batch["pixel_values"],
            text=batch["text"],
            image_key=batch["image_key"],
            seed=seed,
            accelerator=accelerator,
        )
        loss = sum(w * t for w, t in zip(weights.values(), terms, strict=True))
        world = accelerator.num_processes
        scaled = sum(
            w * t * (world if name in GLOBAL_TERMS else 1) for (name, w), t in zip(weights.items(), terms, strict=True)
        )
    accelerator.backward(scaled)
    return {"loss": float(loss.detach()), **{k: float(t.detach()) for k, t in zip(weights, terms, strict=True)}}


@torch.no_grad()
def cross_validation_loss(module, backend, examples, batch_size: int, workers: int) -> float:
    """The objective's mean over in-order batches of `examples`, negatives drawn with seed 0 per
    batch (the same draws at every evaluation); a batch of one image has no negative and is left
    out (and one example alone too)."""
    loader = make_loader(examples, fixed_batches(len(examples), batch_size), backend, workers)
    weights = list(TERMS[backend.objective].values())
    device = next(module.parameters()).device
    losses, sizes = [], []
    for b in loader:
        if len(set(b["image_key"].tolist())) < 2:
            continue
        b = to_device(b, device)
        terms = module(pixel_values=b["pixel_values"], text=b["text"], image_key=b["image_key"], seed=0)
        losses.append(float(sum(w * t for w, t in zip(weights, terms, strict=True))))
        sizes.append(len(b["image_key"]))
    return float(np.average(losses, weights=sizes)) if losses else float("nan")
