"""The stages `counterfactory doctor` runs on one item, each through the code the builders and
the trainer run (not copies):

- `captions`: `CaptionStage.run` (roberta-base MLM proposals, MiniLM similarity) plus
  `CaptionStage.perplexities` of the caption and its counterfactual (gpt2-large), which a random
  MLM's proposals may never reach through `run` alone;
- `p2p-self|cross|both`: `prompt_to_prompt.generate_pairs` for one candidate pair per `--inject`
  mode (SD v1.5 UNet, VAE and text encoder);
- `clip-filters`: `images.score_pairs` on that pair (CLIP ViT-L/14);
- `inpaint`: `decorrelation.fill.ImageFiller.fill` (SD inpainting UNet);
- `verify-removal`: `decorrelation.verify.RemovalVerifier.check` with `ClipZeroShot` over the
  80 COCO classes (CLIP ViT-L/14);
- `mitl-embed`: the scorer calls of `eccv_positives.mitl.embeddings.gallery_embeddings`, one
  image and one caption (open_clip ViT-B/32);
- `train-vit-b32|train-vit-l14`: one step of the trainer's loss (`training.losses.clip_loss` on
  `training.backends.HFClip`, AdamW) on 2 images, then `training.evaluation.encode_texts` and an
  image encode in eval mode;
- `train-blip-base|blip-large|bridgetower`: one optimizer step of the family's finetuning objective
  (training/itm_objectives.py through the trainer's `cross_encoder_step`, AdamW) on 2 examples at
  the published size (builders/devtools/family_training.py); its row adds the memory of a batch
  of the family's recipe (kim2023-blip: 16, le2023-bridgetower: 128), with BridgeTower's B x B
  no-gradient scoring pass measured alone;
- `itm-blip-base|blip-large|bridgetower|vilt|flava`: `CrossEncoderBackend`'s forward (the report's
  ITM score, builders/models/cross_encoders.py) on the image with the caption and its counterfactual,
  each family at its published size (builders/devtools/doctor_families.py).

Each `Stage` names the components it needs (`doctor_models.ModelSource` keys) and how its memory
extrapolates (`per_pixel`: activations grow with the image area; `train`: the weights also hold
gradients and optimizer state). torch and PIL are imported inside the stages, so that listing
the stages (`counterfactory doctor --help`) imports no heavy library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from builders.devtools.doctor_families import FAMILY_ROWS
from builders.devtools.family_training import TRAIN_ROWS, TrainRow
from builders.devtools.doctor_models import ModelSource

CAPTION, COUNTERFACTUAL = "a dog sitting on a couch next to a lamp", "a cat sitting on a couch next to a lamp"
SEED = 0


@dataclass(frozen=True)
class StageSettings:
    resolution: int
    steps: int


@dataclass
class StageResult:
    """What a stage did: how many items (of `Stage.unit`) and a free-form note."""

    items: int
    note: str = ""
    #: Bytes a pair of a no-gradient pass over B x B pairs takes (0: the stage has none).
    square_bytes_per_pair: float = 0.0


@dataclass(frozen=True)
class Stage:
    name: str
    needs: tuple[str, ...]
    #: What one item is (the batch-size column counts these).
    unit: str
    run: Callable[[ModelSource, StageSettings, dict], StageResult]
    #: Activations scale with the image area (extrapolated to 512 px from a smaller run).
    per_pixel: bool = False
    #: A training stage: the static memory is weights + gradients + AdamW state.
    train: bool = False
    #: The models it stands for (shown in the table).
    models: str = ""
    #: A training recipe (training/config.py): the row adds the memory of its batch.
    recipe: str = ""


def _image(resolution: int, shared: dict):
    """The P2P original image when a p2p stage ran, else a seeded random image (PIL)."""
    from PIL import Image

    if "image_0" in shared:
        return Image.fromarray(shared["image_0"]).resize((resolution, resolution))
    rng = np.random.default_rng(SEED)
    return Image.fromarray(rng.integers(0, 256, (resolution, resolution, 3), dtype=np.uint8))


def _mask(resolution: int) -> np.ndarray:
    """A centred box covering a quarter of the image: the removed object."""
    mask = np.zeros((resolution, resolution), dtype=bool)
    mask[resolution // 4 : 3 * resolution // 4, resolution // 4 : 3 * resolution // 4] = True
    return mask


def run_captions(src: ModelSource, s: StageSettings, shared: dict) -> StageResult:
    from builders.counterfactuals.captions import CaptionModels, CaptionStage
    from builders.counterfactuals.config import CaptionStageConfig
    from builders.engine.nltk_setup import ensure_nltk_tagger

    ensure_nltk_tagger()
    (mlm, mlm_tok), (lm, lm_tok) = src.get("mlm"), src.get("lm")
    stage = CaptionStage(CaptionModels(mlm, mlm_tok, lm, lm_tok, src.get("sentence")), CaptionStageConfig())
    outcome = stage.run([CAPTION])[0]
    perplexities = stage.perplexities([CAPTION, COUNTERFACTUAL])
    result = outcome if isinstance(outcome, str) else "counterfactual found"
    return StageResult(1, f"random weights: {result}; perplexity {perplexities[0]:.3g}")


def p2p_runner(inject: str) -> Callable[[ModelSource, StageSettings, dict], StageResult]:
    def run(src: ModelSource, s: StageSettings, shared: dict) -> StageResult:
        from builders.counterfactuals.prompt_to_prompt import PairSpec, UNetWork, generate_pairs

        work = UNetWork()
        # p = 1: the pair injects at every step but the last, so every injected path runs.
        images_0, images_1 = generate_pairs(
            src.get("sd"),
            CAPTION,
            COUNTERFACTUAL,
            [PairSpec(seed=SEED, p=1.0, guidance=7.5)],
            steps=s.steps,
            size=s.resolution,
            inject=inject,
            work=work,
        )
        shared["image_0"], shared["image_1"] = images_0[0], images_1[0]
        return StageResult(1, f"{work.unet_rows} UNet rows, {work.decoded} decoded")

    return run


def run_clip_filters(src: ModelSource, s: StageSettings, shared: dict) -> StageResult:
    from builders.counterfactuals.images import score_pairs

    image_0 = np.array(_image(s.resolution, shared))
    image_1 = shared.get("image_1", image_0)
    scores = score_pairs(src.get("clip_filter"), CAPTION, COUNTERFACTUAL, image_0[None], np.asarray(image_1)[None])
    return StageResult(1, f"directional {scores.directional[0].item():.3f}")


def run_inpaint(src: ModelSource, s: StageSettings, shared: dict) -> StageResult:
    from builders.decorrelation.config import FillConfig
    from builders.decorrelation.fill import ImageFiller

    filler = ImageFiller(FillConfig(method="inpaint", model="doctor", steps=s.steps, image_size=s.resolution))
    # The filler loads its pipeline on first use: hand it the doctor's instead of a Hub id.
    filler._pipe = src.get("sd_inpaint")
    image = _image(s.resolution, shared)
    shared["filled"] = filler.fill(image, _mask(s.resolution), SEED)
    return StageResult(1, f"{s.steps} steps")


def run_verify(src: ModelSource, s: StageSettings, shared: dict) -> StageResult:
    from counterfactory_metrics.odmap.class_match import COCO_CLASSES

    from builders.decorrelation.config import VerifyConfig
    from builders.decorrelation.verify import ClipZeroShot, RemovalVerifier

    config = VerifyConfig(enabled=True, model="doctor")
    verifier = RemovalVerifier(config, COCO_CLASSES)
    # The verifier loads its scorer on first use: hand it one on the doctor's CLIP.
    verifier._scorer = ClipZeroShot(src.get("clip_filter"), COCO_CLASSES, config.prompt)
    image = _image(s.resolution, shared)
    verdict = verifier.check(image, shared.get("filled", image), _mask(s.resolution), ["dog"])
    return StageResult(1, f"80 class prompts; p(dog) after {verdict.after[0]:.3f}")


def run_mitl(src: ModelSource, s: StageSettings, shared: dict) -> StageResult:
    scorer = src.get("open_clip")
    images = scorer.images([_image(s.resolution, shared)]).cpu().numpy()
    texts = scorer.texts([CAPTION]).cpu().numpy()
    return StageResult(1, f"embedding width {images.shape[1]} (text {texts.shape[1]})")


def train_runner(role: str) -> Callable[[ModelSource, StageSettings, dict], StageResult]:
    def run(src: ModelSource, s: StageSettings, shared: dict) -> StageResult:
        return _train_step(src.get(role), src.device)

    return run


def _train_step(scorer: Any, device: str) -> StageResult:
    import torch

    from builders.models.clip_ids import ClipId
    from training.backends import Backend, HFClip, HFTokenize, PixelPipeline
    from training.evaluation import encode_texts
    from training.losses import clip_loss

    ip = scorer.processor.image_processor
    size = ip.crop_size["height"] if ip.do_center_crop else ip.size["shortest_edge"]
    pixels = PixelPipeline(size, tuple(ip.image_mean), tuple(ip.image_std))
    tokenize = HFTokenize(scorer.processor.tokenizer)
    clip = ClipId("transformers", "doctor", "doctor")
    backend = Backend(clip, HFClip(scorer.model).train(), pixels, tokenize, scorer.processor)
    module = backend.module
    rng = np.random.default_rng(SEED)
    batch = torch.from_numpy(rng.integers(0, 256, (2, 3, size, size), dtype=np.uint8))
    texts = [CAPTION, COUNTERFACTUAL]
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-6)
    image, text, _, scale = module(
        pixel_values=pixels.per_batch(batch).to(device), text={k: v.to(device) for k, v in tokenize(texts).items()}
    )
    loss = clip_loss(image, text, scale)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    module.eval()
    text_emb = encode_texts(module, backend, texts, batch_size=2)
    with torch.no_grad():
        image_emb = module(pixel_values=pixels.per_batch(batch).to(device))[0].float().cpu().numpy()
    recall = float(np.mean((image_emb @ text_emb.T).argmax(1) == np.arange(2)))
    del optimizer
    return StageResult(2, f"loss {loss.item():.3f}; eval R@1 {recall:.2f} on 2 images")


def family_train_runner(row: TrainRow) -> Callable[[ModelSource, StageSettings, dict], StageResult]:
    def run(src: ModelSource, s: StageSettings, shared: dict) -> StageResult:
        from builders.devtools import family_training as ft
        from builders.devtools.peak_memory import PeakMemory

        backend = ft.training_backend(src.get(row.arch))
        batch = ft.example_batch(backend, ft.STEP_EXAMPLES, src.device)
        accelerator = ft.OneProcess(src.device)
        square = 0.0
        if row.square:
            # Before the step (no gradients or moments yet): the pass alone, per pair scored. On
            # CUDA this resets the peak counter, which the step's own B x B pass then raises again.
            with PeakMemory(src.device) as memory:
                pairs = ft.square_pass(backend, batch, accelerator)
            square = max(memory.peak - memory.base, 0) / pairs
        optimizer = ft.optimizer_for(backend)
        terms = ft.train_step(backend, batch, optimizer, accelerator)
        backend.module.eval()
        del optimizer
        losses = ", ".join(f"{k} {v:.3f}" for k, v in terms.items())
        return StageResult(ft.STEP_EXAMPLES, f"one step: {losses}", square_bytes_per_pair=square)

    return run


def itm_runner(key: str) -> Callable[[ModelSource, StageSettings, dict], StageResult]:
    def run(src: ModelSource, s: StageSettings, shared: dict) -> StageResult:
        from builders.devtools.doctor_families import score_pairs

        return StageResult(*score_pairs(src.get(key), _image(s.resolution, shared), [CAPTION, COUNTERFACTUAL]))

    return run


STAGES: tuple[Stage, ...] = (
    Stage(
        "captions", ("mlm", "lm", "sentence"), "captions", run_captions, models="roberta-base + gpt2-large + MiniLM-L6"
    ),
    *(
        Stage(
            f"p2p-{mode}", ("sd",), "candidate pairs", p2p_runner(mode), per_pixel=True, models="SD v1.5 UNet+VAE+text"
        )
        for mode in ("self", "cross", "both")
    ),
    Stage("clip-filters", ("clip_filter",), "candidate pairs", run_clip_filters, models="CLIP ViT-L/14"),
    Stage("inpaint", ("sd_inpaint",), "images", run_inpaint, per_pixel=True, models="SD inpainting UNet+VAE+text"),
    Stage("verify-removal", ("clip_filter",), "removals", run_verify, models="CLIP ViT-L/14"),
    Stage("mitl-embed", ("open_clip",), "images", run_mitl, models="open_clip ViT-B/32"),
    Stage("train-vit-b32", ("clip",), "images", train_runner("clip"), train=True, models="CLIP ViT-B/32"),
    Stage(
        "train-vit-l14", ("clip_filter",), "images", train_runner("clip_filter"), train=True, models="CLIP ViT-L/14"
    ),
    *(
        Stage(
            row.stage,
            (row.arch,),
            "examples",
            family_train_runner(row),
            train=True,
            models=row.models,
            recipe=row.recipe,
        )
        for row in TRAIN_ROWS
    ),
    *(Stage(row.stage, (row.arch,), "pairs", itm_runner(row.arch), models=row.models) for row in FAMILY_ROWS),
)
STAGE_NAMES = tuple(stage.name for stage in STAGES)
