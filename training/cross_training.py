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

import logging

import numpy as np
import torch
from PIL import Image
from torchvision import transforms

from builders.engine.errors import UserFacingError
from builders.models.clip_ids import TRANSFORMERS, ClipId
from builders.models.families import FamilyError, model_family
from builders.models.rgb import TransformersRGB
from training.backends import Backend, FloorCenterCrop, HFTokenize, PixelPipeline, load_backend
from builders.models.cross_encoders import CrossEncoderBackend
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

    def __init__(self, clip: ClipId, module, processor, model_type: str) -> None:
        Backend.__init__(self, clip, module, family_pixels(processor.image_processor, model_type), None, processor)
        CrossEncoderBackend.__init__(self, clip, module, processor)
        self.tokenize = HFTokenize(processor.tokenizer)
        self.objective = module.objective
        self.family = model_type

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


def load_training_backend(clip: ClipId, asked: str = TRANSFORMERS) -> Backend:
    """The backend `clip` trains with: CLIP / open_clip (training/backends.py), or a BLIP or
    BridgeTower retrieval checkpoint (its family from config.json), checked against `asked`
    (`--backend`)."""
    if clip.backend != TRANSFORMERS:
        return load_backend(clip)
    try:
        found = model_family(clip.name)
    except FamilyError as err:
        raise UserFacingError(f"--model {clip.label}: {err}") from None
    want = CROSS_BACKENDS.get(asked)
    if want is not None and found.family.model_type != want:
        raise UserFacingError(
            f"--backend {asked} trains a {want} checkpoint, but --model {clip.label} is "
            f"{found.family.name} ({found.architecture}); give a {want} checkpoint or its --backend"
        )
    if found.dual_encoder:
        return load_backend(clip)
    if found.architecture not in TRAINABLE:
        raise UserFacingError(
            f"--model {clip.label} is {found.family.name} ({found.architecture}): counterfactory trains "
            f"CLIP, open_clip, BLIP ({', '.join(TRAINABLE)}); score it with `counterfactory benchmark`"
        )
    from builders.models.loaders import load_image_text_model

    model, processor = load_image_text_model(clip.name, found.architecture)
    module = TRAINABLE[found.architecture](model.train())
    backend = CrossEncoderTraining(clip, module, processor, found.family.model_type)
    backend.ranker = trainer_ranker(backend, clip.label, found.architecture)
    return backend


def trainer_ranker(backend, label: str, architecture: str):
    """The evaluation's retrieval by the cross-encoder (training/rerank.py, the code `counterfactory
    benchmark` ranks with, at its default k): BLIP's ITC top k re-ranked by ITM + ITC. An ITM model
    with no contrastive head (BridgeTower's) has no first stage here: its real pairs' G only, said
    in one line."""
    from training.rerank import DEFAULT_K, FIRST_STAGE_METHOD, Ranker, RankerSpec, method_of

    method = method_of(architecture)
    if method != FIRST_STAGE_METHOD:
        return Ranker(backend, RankerSpec(method, DEFAULT_K))
    log.warning(
        "--model %s (%s) has no first stage in the trainer: no retrieval metrics (R@K, ODmAP), the ITM "
        "deltas still run; `counterfactory benchmark --first-stage MODEL` ranks by re-ranking",
        label,
        architecture,
    )
    return Ranker(backend, None)


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
    was trained (training/losses.py), a cross-encoder's family objective (its options checked);
    the run record's `objective` and `retrieval` (method, k) entries (none for a dual encoder)."""
    if backend.dual_encoder:
        cfg.optim.loss = resolve_loss(cfg.optim.loss, backend.has_logit_bias, backend.model_id)
        return {}
    check_cross_options(cfg)
    cfg.optim.loss = backend.objective
    spec = backend.ranker.spec
    return {"objective": backend.record(), "retrieval": spec.record() if spec else None}


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
