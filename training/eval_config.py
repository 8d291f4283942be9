"""What an evaluation reads: the sets to score and how, without any training setting.

The trainer derives it from its `TrainConfig` (`EvalConfig.of`); the model report
(`counterfactory benchmark`, training/report/) builds one per dataset from its own flags, so it
scores a model with the code `--eval-only` runs without making up a training run. The model is
not in it: one `EvalConfig` scores several models (the report's) or the same model at several
steps (the trainer's), and the module it is given runs on its own device, in its own dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from loading_scripts.images import DEFAULT_MAX_IMAGE_PIXELS
from training.config import SourceRef, TrainConfig


@dataclass(frozen=True)
class EvalConfig:
    """Example: `EvalConfig(decorrelation=SourceRef("org/decorrelation", "v1.0.0"),
    eval_batch_size=128)`. Each field is the trainer's flag of the same name, with its default."""

    #: The coco-captions build: R@K on `real_test_split` ('' or None: none).
    real: SourceRef | None = None
    real_test_split: str | None = "test"
    #: The decorrelation build: ODmAP@K on its `odmap_*` sets.
    decorrelation: SourceRef | None = None
    #: A coco-counterfactuals build: ITM deltas (IR_c, TR_c) on the pairs of `counterfactuals_split`.
    counterfactuals: SourceRef | None = None
    counterfactuals_split: str = "test"
    #: Zero-shot classification sets (`DATASET[:SPLIT]`) and their decoding bound.
    zeroshot: tuple[str, ...] = ()
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    #: A Flickr30k folder: R@K both ways on its Karpathy `flickr30k_split`.
    flickr30k: str | None = None
    flickr30k_split: str = "test"
    #: Embeddings and validation loss per batch; DataLoader workers decoding images.
    eval_batch_size: int = 64
    num_workers: int = 0
    k_values: tuple[int, ...] = (1, 5, 10)
    #: The ECCV Caption suite on COCO 5K, with PMRP from COCO's instances file.
    eccv: bool = False
    coco_instances: str | None = None
    #: The validation loss's (the loss the model was trained with: `clip` or `siglip`).
    loss: str = "clip"

    @classmethod
    def of(cls, cfg: TrainConfig) -> EvalConfig:
        """The evaluation of a training run (`cfg.optim.loss` resolved by then: the trainer
        resolves it when it loads the model)."""
        d, r = cfg.data, cfg.run
        return cls(
            real=d.real,
            real_test_split=d.real_test_split,
            decorrelation=d.decorrelation,
            counterfactuals=d.counterfactuals,
            counterfactuals_split=d.counterfactuals_split,
            zeroshot=d.zeroshot,
            max_image_pixels=d.max_image_pixels,
            flickr30k=d.flickr30k,
            flickr30k_split=d.flickr30k_split,
            eval_batch_size=r.eval_batch_size,
            num_workers=d.num_workers,
            k_values=tuple(r.k_values),
            eccv=r.eccv,
            coco_instances=r.coco_instances,
            loss=cfg.optim.loss or "clip",
        )
