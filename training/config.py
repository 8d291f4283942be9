"""Typed run configuration of the trainer and the paper recipes; each field declares its flag.

Every field of `DataConfig`, `OptimConfig` and `RunConfig` (and `TrainConfig.recipe`) is a flag
`--FIELD-NAME` whose help text and argparse keywords sit in the field's metadata (`option`), so a
new setting is one field: training/options.py generates the parser from these classes with the
builders' generator (`builders.engine.options`).

Precedence: dataclass defaults < `--recipe` preset < flags given on the command line, so every
field of a recipe can be overridden (`--recipe kim2023 --epochs 1`).

Recipes (the papers' finetuning set-ups):

- `kim2023` (object decorrelation, Kim et al. 2023 §4.1 / builders/decorrelation/METHOD.md §6):
  10 epochs, batch 256, Adam, lr 2e-6, lr x 0.5 every 2 epochs. The paper names plain Adam and
  published no code, so Adam's own defaults stand for what it does not state: betas (0.9, 0.999),
  eps 1e-8 (Kingma & Ba 2015, `torch.optim.Adam`); and the incomplete last batch is dropped, so
  every step has the paper's batch of 256 (the trainer's default, as open_clip_train's).
- `kim2023-blip` (its BLIP arm, same §4.1 / §6): `--backend blip` on D ∪ D', 2 epochs, batch 16,
  AdamW lr 1e-5, x 0.5 every half epoch; the rest is BLIP's COCO retrieval finetuning (Li et al.
  2022, `retrieval_coco.yaml`): weight decay 0.05, AdamW's defaults, last batch dropped.
- `le2023` (COCO-Counterfactuals, Le et al. 2023 §5 / builders/counterfactuals/METHOD.md §5):
  AdamW, lr 5e-7, weight decay 0.001, batch 128, best checkpoint by validation loss. The paper
  finetuned with Hugging Face's `examples/pytorch/contrastive-image-text/run_clip.py`, so what
  it does not state is the `transformers.TrainingArguments` defaults: 3 epochs
  (`num_train_epochs`), linear decay to 0 (`lr_scheduler_type="linear"`, no warm-up),
  `max_grad_norm` 1.0, no weight decay on biases and LayerNorm weights
  (`Trainer.get_decay_parameter_names`), AdamW betas (0.9, 0.999) and eps 1e-8 (`adam_beta1`,
  `adam_beta2`, `adam_epsilon`), and the incomplete last batch kept (`dataloader_drop_last=False`:
  ceil(N / 128) steps an epoch).
- `le2023-bridgetower` (its BridgeTower arm, Le et al. 2023 Appendix A.1, which states no
  hyperparameters of its own): `--backend bridgetower` with `le2023`'s, the only ones the paper
  states (Appendix B.3.2); the mixture is the user's `--mix` (docs/training.md).

Every run, whatever the recipe, keeps biases, normalisation weights and `logit_scale` out of
weight decay and clamps the logit scale to ln 100 after each step, as CLIP and open_clip do
(training/optimization.py).

Example:
    >>> from training.options import build_parser, config_from_args
    >>> cfg = config_from_args(build_parser().parse_args(
    ...     ["--real", "out/coco-captions", "--output", "run", "--recipe", "kim2023", "--epochs", "1"]))
    >>> cfg.optim.lr, cfg.optim.epochs, cfg.optim.batch_size
    (2e-06, 1, 256)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from builders.engine.errors import UserFacingError
from builders.engine.options import option
from builders.engine.option_types import non_negative_int, non_negative_number, positive_int, positive_number, seed_int
from builders.models.clip_ids import ClipId, ClipIdError, parse_clip_id
from builders.models.pickled_weights import FLAG_HELP as PICKLED_WEIGHTS_HELP
from builders.publishing.hub_client import repo_id_problem
from training.augmentation import parse_aug_cfg
from training.retrieval_options import DEFAULT_K
from loading_scripts.images import DEFAULT_MAX_IMAGE_PIXELS

MIXES = ("none", "decorrelation", "cf:real", "cf:base", "cf:medium", "cf:all")
HARD_NEGATIVES = ("none", "pairs", "negclip")
#: blip / bridgetower: a cross-encoder trained with its family's objective (training/cross_training.py).
BACKENDS = ("transformers", "open_clip", "blip", "bridgetower")
REPORT_TO = ("auto", "tensorboard", "wandb", "none")
#: Backend -> (model, pretrained tag) when --model is not given: CLIP ViT-B/32 with OpenAI's
#: weights in both (open_clip names the architecture and the weights separately).
DEFAULT_MODELS: dict[str, tuple[str, str | None]] = {
    "transformers": ("openai/clip-vit-base-patch32", None),
    "open_clip": ("ViT-B-32", "openai"),
    "blip": ("Salesforce/blip-itm-base-coco", None),
    "bridgetower": ("BridgeTower/bridgetower-large-itm-mlm-itc", None),
}

#: Recipe name -> {section: {field: value}}.
RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "kim2023": {
        "optim": {
            "epochs": 10,
            "batch_size": 256,
            "optimizer": "adam",
            "lr": 2e-6,
            "weight_decay": 0.0,
            "schedule": "step",
            "step_epochs": 2,
            "step_gamma": 0.5,
            "beta1": 0.9,
            "beta2": 0.999,
            "eps": 1e-8,
            "last_batch": "drop",
        }
    },
    "le2023": {
        "optim": {
            "optimizer": "adamw",
            "lr": 5e-7,
            "weight_decay": 0.001,
            "batch_size": 128,
            "epochs": 3,
            "schedule": "linear",
            "warmup_steps": 0,
            "max_grad_norm": 1.0,
            "beta1": 0.9,
            "beta2": 0.999,
            "eps": 1e-8,
            "last_batch": "keep",
        },
        "run": {"best_by_val_loss": True, "eval_batch_size": 128},
    },
}
#: The papers' other arms: kim2023's schedule with BLIP's optimiser; le2023's on BridgeTower.
RECIPES["kim2023-blip"] = {
    "data": {"mix": "decorrelation"},
    "optim": RECIPES["kim2023"]["optim"]
    | dict(epochs=2, batch_size=16, step_epochs=0.5, optimizer="adamw", lr=1e-5, weight_decay=0.05),
    "run": {"backend": "blip"},
}
RECIPES["le2023-bridgetower"] = {**RECIPES["le2023"], "run": {**RECIPES["le2023"]["run"], "backend": "bridgetower"}}


@dataclass
class SourceRef:
    """One of our datasets: a Hub repo id or a local build folder, at a revision (tag/branch/sha).
    A `SourceRef` field is the two flags `--NAME REPO_OR_DIR` and `--NAME-revision REV`."""

    path: str
    revision: str | None = None


@dataclass
class DataConfig:
    """What to train and evaluate on. Example: `DataConfig(real=SourceRef("org/coco-captions",
    "v1.0.0"), decorrelation=SourceRef("org/decorrelation", "v1.0.0"), mix="decorrelation",
    ratio=0.1)`."""

    #: The real pairs D: a `coco-captions` build (its `default` config, one row per image).
    real: SourceRef | None = option(
        None, "the coco-captions build (repo id or folder): D and the retrieval test split"
    )
    #: The paper's "train" is train + restval.
    real_train_splits: tuple[str, ...] = option(
        ("train", "restval"),
        "splits of --real to train on with --mix none|decorrelation (cf: mixes "
        "take each pair's real image by id from any split)",
    )
    #: Used with `--mix none|decorrelation`; the cf: mixes validate on their own 20 %.
    real_val_split: str | None = option(
        "val", "split of --real for the validation loss ('' for none; cf: mixes hold out 20%%)"
    )
    #: COCO 5K/1K protocol: 5 captions per image.
    real_test_split: str | None = option("test", "split of --real for R@K (all 5 captions per image; '' to skip)")
    #: D' (`default/train`) and the ODmAP@k sets (`odmap_*`/`test`).
    decorrelation: SourceRef | None = option(
        None, "the decorrelation build (repo id or folder): D' and the ODmAP@k sets"
    )
    #: Rows image_0/image_1/caption_0/caption_1 of its `default` config.
    counterfactuals: SourceRef | None = option(
        None,
        "a coco-counterfactuals build (repo id or folder): --mix cf:* train on it and hold "
        "out 20%% for the ITM deltas; with --mix none|decorrelation it is not trained on and "
        "every pair of --counterfactuals-split is scored (IR_c, TR_c), also with --eval-only",
    )
    #: The default is the one split `counterfactory build coco-counterfactuals` publishes, like
    #: the original release: the `cf:` mixtures train on 80 % of it; with another mix all of it
    #: is held out for the ITM deltas (training/mixtures.py).
    counterfactuals_split: str = option(
        "test", "split of the --counterfactuals build to read (all of it is scored when no cf: mix trains on it)"
    )
    mix: str = option(
        "none",
        "none: D; decorrelation: D + D'_sub; cf:base|medium|all: COCO-Counterfactuals "
        "mixtures; cf:real: their real rows only (the paper's baseline)",
        choices=MIXES,
    )
    ratio: float | None = option(None, "|D'_sub| / |D| for --mix decorrelation (default: all of D')")
    #: Not the batch order (that is --seed).
    data_seed: int = option(0, "seed of the mixture sampling and the 80/20 split", type=seed_int)
    hard_negatives: str = option(
        "none", "pairs: both rows of a pair in one batch; negclip: extra i2t text negatives", choices=HARD_NEGATIVES
    )
    #: The workers decode the parquet image bytes.
    num_workers: int = option(2, "DataLoader workers decoding images (0: in the main process)", type=non_negative_int)
    #: Evaluated only, never trained on (training/zeroshot.py).
    zeroshot: tuple[str, ...] = option(
        (),
        "zero-shot classification (top-1/5, CLIP's 80 prompt templates) on a datasets id, "
        "folder or imagefolder with an image and a ClassLabel column; repeatable",
        action="extend",
        metavar="DATASET[:SPLIT]",
    )
    flickr30k: str | None = option(
        None, "a Flickr30k folder (flickr30k-images/ + Karpathy dataset_flickr30k.json): R@K both ways", metavar="DIR"
    )
    flickr30k_split: str = option("test", "Karpathy split of --flickr30k to evaluate (default test)")
    #: The builders' bound (loading_scripts/images.py), checked from the header before decoding.
    max_image_pixels: int = option(
        DEFAULT_MAX_IMAGE_PIXELS,
        "skip (and count as image_too_large) a --zeroshot image of more "
        "pixels, checked from its header before decoding (default %(default)s)",
        type=positive_int,
        metavar="N",
    )
    #: Off by default: the inputs then equal the backend's reference preprocessing.
    fast_decode: bool = option(
        False,
        "decode training JPEGs in PIL draft mode (faster; pixels differ from the reference "
        "processor by a few grey levels; evaluation always decodes fully)",
    )
    #: Off by default: training then sees the evaluation transform (run_clip.py's choice).
    augment: bool = option(
        False,
        "train on open_clip's train transform (RandomResizedCrop scale (0.9, 1.0), bicubic) "
        "instead of the evaluation one; evaluation is unchanged",
    )
    #: open_clip_train's `--aug-cfg` syntax: values read as Python literals.
    aug_cfg: tuple[str, ...] = option(
        (),
        "with --augment, open_clip's augmentation settings, e.g. scale='(0.5, 1.0)' "
        "color_jitter='(0.4, 0.4, 0.4, 0.1)' color_jitter_prob=0.8 gray_scale_prob=0.2",
        metavar="KEY=VALUE",
    )


@dataclass
class OptimConfig:
    """Optimisation. Example: `OptimConfig(lr=2e-6, epochs=10, batch_size=256, schedule="step")`."""

    epochs: int = option(1, "passes over the training data (default 1)")
    #: One optimizer step before accumulation, all processes together.
    batch_size: int = option(64, "global batch (all processes together)")
    #: The micro-batches make one contrastive batch (training/accumulation.py).
    grad_accum: int = option(
        1,
        "micro-batches of --batch-size per optimizer step: one contrastive "
        "batch of --batch-size x N, features cached as open_clip's --accum-freq",
    )
    optimizer: Literal["adam", "adamw"] = option("adamw", "optimizer (default adamw)")
    lr: float = option(1e-5, "peak learning rate (default 1e-5)", type=positive_number)
    beta1: float = option(0.9, "Adam's beta1 (default 0.9)")
    beta2: float = option(0.999, "Adam's beta2 (default 0.999; open_clip_train takes 0.98 for ViTs)")
    eps: float = option(1e-8, "Adam's epsilon (default 1e-8; open_clip_train takes 1e-6 for ViTs)")
    #: None: the model's (training/losses.py `resolve_loss`).
    loss: Literal["clip", "siglip"] | None = option(
        None,
        "contrastive loss: clip (softmax) or siglip (sigmoid, for a model with a logit_bias); "
        "default: the one the model was trained with, the other is refused",
    )
    last_batch: Literal["drop", "keep"] = option(
        "drop",
        "the incomplete last batch of an epoch: drop (floor(N/B) steps, as open_clip) or "
        "keep (ceil(N/B), as run_clip.py; le2023)",
    )
    weight_decay: float = option(0.0, "weight decay of the optimizer (default 0)", type=non_negative_number)
    schedule: Literal["constant", "cosine", "linear", "step"] = option(
        "constant", "lr after warm-up (linear: to 0 at the last step; step: x --step-gamma every --step-epochs epochs)"
    )
    warmup_steps: int = option(0, "optimizer steps of linear lr warm-up (default 0)", type=non_negative_int)
    #: A fraction is a part of an epoch (kim2023-blip: 0.5, every half epoch).
    step_epochs: float = option(
        2, "--schedule step: epochs between lr multiplications, e.g. 0.5 (default 2)", type=positive_number
    )
    step_gamma: float = option(
        0.5, "--schedule step: lr factor every --step-epochs epochs (default 0.5)", type=non_negative_number
    )
    max_grad_norm: float | None = option(
        None, "clip the gradient norm to this (default: no clipping)", type=positive_number
    )
    max_steps: int | None = option(None, "stop after this many optimizer steps")
    lock_image: bool = option(False, "freeze the image tower")
    lock_text: bool = option(False, "freeze the text tower")
    mixed_precision: Literal["no", "fp16", "bf16"] = option(
        "no",
        "accelerate's mixed precision (default no); fp16 needs a GPU, bf16 a CPU or a GPU "
        "with bfloat16: anything else is refused",
    )
    grad_checkpointing: bool = option(False, "recompute activations in the backward pass (less memory, more compute)")


@dataclass
class RunConfig:
    """Where and how the run goes. Example: `RunConfig(output="runs/a", seed=107)`."""

    output: str = option("runs/finetune", "run folder (checkpoints, metrics, final model)")
    backend: str = option("transformers", "transformers (CLIPModel) or open_clip", choices=BACKENDS)
    #: None: DEFAULT_MODELS[backend].
    model: str | None = option(
        None,
        "Hub id or folder (transformers; default openai/clip-vit-base-patch32); ARCH, "
        "ARCH:TAG, hf-hub:..., local-dir:PATH (open_clip; default ViT-B-32 + --pretrained openai)",
    )
    pretrained: str | None = option(
        None,
        "open_clip weights tag of an architecture --model (ViT-B-32: openai, laion2b_s34b_b79k, ...)",
        metavar="TAG",
    )
    seed: int = option(0, "training seed (batch order)", type=seed_int)
    eval_every: int = option(0, "evaluate every N steps (default: every epoch)", type=non_negative_int)
    #: 0: only per epoch.
    save_every: int = option(0, "checkpoint every N steps (and always per epoch)", type=non_negative_int)
    best_by_val_loss: bool = option(False, "final model = the evaluation with the lowest validation loss")
    #: The checkpoint must be of the same training configuration (`training_fingerprint`).
    resume: str | None = option(
        None,
        "`latest` (newest checkpoint under --output) or a checkpoint folder, of a run with the same training flags",
    )
    #: Without it (or --resume) an --output holding anything is refused (training/run_folder.py).
    overwrite_output_dir: bool = option(
        False,
        "delete an earlier run's files in --output first (refused, deleting nothing, when "
        "the folder holds other files); without it or --resume a non-empty --output is refused",
    )
    eval_only: bool = option(False, "only evaluate --model (e.g. the pretrained baseline)")
    expect_processes: int | None = option(None, "fail unless this many processes were launched", type=positive_int)
    push_to_hub: str | None = option(None, "upload the final model + card to this model repo", metavar="ORG/NAME")
    eval_batch_size: int = option(
        64, "batch size of the evaluation: embeddings and validation loss (default 64)", type=positive_int
    )
    #: ODmAP@k / R@K cut-offs.
    k_values: tuple[int, ...] = option((1, 5, 10), "K of R@K and ODmAP@K", type=positive_int)
    eccv: bool = option(False, "also the ECCV Caption suite (needs the COCO 5K test split)")
    #: PMRP's plausible-match positives are computed from it (eccv_caption does not ship them).
    coco_instances: str | None = option(
        None, "with --eccv, also PMRP: COCO's annotations/instances_val2014.json", metavar="PATH"
    )
    log_every: int = option(1, "log the loss and lr every N optimizer steps (default 1)", type=positive_int)
    #: Without it a run whose training images include any image of an evaluation set is refused
    #: before the first step (training/leakage.py).
    allow_eval_overlap: bool = option(
        False,
        "report metrics on evaluation sets sharing images with the training data (marked "
        "as overlapping in metrics.md and the model card) instead of refusing the run",
    )
    #: auto: TensorBoard when it is installed, else none.
    report_to: str = option(
        "auto",
        "experiment tracker of the loss and lr through accelerate (auto: tensorboard when installed)",
        choices=REPORT_TO,
    )
    #: None: keep all.
    keep_checkpoints: int | None = option(
        None, "keep only the newest N checkpoints under OUTPUT/checkpoints (default: all)", type=positive_int
    )
    #: Off: --model's weights (and a --resume checkpoint's) load from safetensors only.
    trust_pickled_weights: bool = option(False, PICKLED_WEIGHTS_HELP)
    #: training/statistics.py: the final metrics' intervals and the before -> after differences'
    #: (resamples seeded by --seed).
    bootstrap: int = option(
        1000,
        "resamples of each metric's units for the 95%% intervals of the "
        "final evaluation and of its difference from the base model "
        "(default 1000; 0: none)",
        type=non_negative_int,
        metavar="N",
    )
    #: --first-stage / --rerank-k (training/retrieval_options.py, the benchmark's flags): how a
    #: cross-encoder ranks (training/rerank.py). Evaluation only, so outside the fingerprint.
    first_stage: str | None = None
    rerank_k: int = DEFAULT_K

    def weights(self) -> tuple[str, str | None]:
        """(model, pretrained tag) with the backend's defaults filled in."""
        if self.model is not None:
            return self.model, self.pretrained
        model, tag = DEFAULT_MODELS[self.backend]
        return model, self.pretrained or tag

    def clip_id(self) -> ClipId:
        """The model the backend loads, parsed once here (every layer below takes the `ClipId`);
        an id naming nothing, or a --pretrained tag beside an id that names its weights, is one
        line naming --model."""
        model, tag = self.weights()
        # A BLIP or BridgeTower checkpoint is a transformers id; its family is its config's.
        backend = "transformers" if self.backend in ("blip", "bridgetower") else self.backend
        try:
            return parse_clip_id(model, backend, tag)
        except ClipIdError as err:
            raise UserFacingError(f"--model {model[:200]!r} {err}") from None


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    recipe: str | None = option(None, "paper preset; flags override it", choices=sorted(RECIPES))

    def check(self) -> None:
        """Option errors that need no data: raised before anything is loaded."""
        d, o, r = self.data, self.optim, self.run
        if d.mix not in MIXES:
            raise UserFacingError(f"--mix {d.mix!r} is unknown; choose one of {', '.join(MIXES)}")
        if d.hard_negatives not in HARD_NEGATIVES:
            raise UserFacingError(
                f"--hard-negatives {d.hard_negatives!r} is unknown; choose one of {', '.join(HARD_NEGATIVES)}"
            )
        if r.backend not in BACKENDS:
            raise UserFacingError(f"--backend {r.backend!r} is unknown; choose one of {', '.join(BACKENDS)}")
        if r.pretrained is not None and r.backend != "open_clip":
            raise UserFacingError(
                "--pretrained names open_clip weights; with --backend transformers "
                "give the checkpoint as --model (Hub id or folder)"
            )
        r.clip_id()  # an id naming nothing (or a --pretrained it cannot take) fails before any load
        if d.real is None and (not r.eval_only or d.mix.startswith("cf:")):
            raise UserFacingError(
                "--real is required: the coco-captions build (folder or repo id) "
                "holding the real pairs D and their images"
            )
        if d.mix == "decorrelation" and d.decorrelation is None:
            raise UserFacingError("--mix decorrelation needs --decorrelation (the decorrelation build)")
        if d.mix.startswith("cf:") and d.counterfactuals is None:
            raise UserFacingError(f"--mix {d.mix} needs --counterfactuals (a coco-counterfactuals build)")
        if d.ratio is not None and (d.mix != "decorrelation" or d.ratio <= 0):
            raise UserFacingError(f"--ratio {d.ratio} applies only to --mix decorrelation and must be > 0")
        if o.batch_size < 1 or o.grad_accum < 1 or o.epochs < 1:
            raise UserFacingError("--batch-size, --grad-accum and --epochs must be >= 1")
        if o.lock_image and o.lock_text:
            raise UserFacingError("--lock-image and --lock-text together leave nothing to train")
        if r.resume and r.overwrite_output_dir:
            raise UserFacingError(
                "--resume continues the run in --output and --overwrite-output-dir deletes it; give one of them"
            )
        if not (0 <= o.beta1 < 1 and 0 <= o.beta2 < 1 and o.eps > 0):
            raise UserFacingError(
                f"--beta1 {o.beta1} --beta2 {o.beta2} --eps {o.eps}: Adam needs "
                "betas in [0, 1) and eps > 0 (e.g. 0.9 0.999 1e-8)"
            )
        if d.aug_cfg and not d.augment:
            raise UserFacingError("--aug-cfg configures the training augmentation: give --augment too")
        parse_aug_cfg(d.aug_cfg)
        if r.coco_instances and not r.eccv:
            raise UserFacingError("--coco-instances adds PMRP to the ECCV Caption suite: give --eccv too")
        if r.eccv and (d.real is None or not d.real_test_split):
            raise UserFacingError(
                "--eccv scores the COCO 5K test split: give --real (a coco-captions build) and --real-test-split test"
            )
        self._check_push_to_hub()

    def _check_push_to_hub(self) -> None:
        """A repo id the Hub would refuse fails now, not after the training."""
        repo_id = self.run.push_to_hub
        if repo_id is None:
            return
        if self.run.eval_only:
            raise UserFacingError(
                "--push-to-hub uploads the trained model, and --eval-only trains none; drop one of them"
            )
        problem = repo_id_problem(repo_id)
        if problem:
            raise UserFacingError(
                f"--push-to-hub {repo_id[:200]!r} is {problem}: give ORG/NAME, each "
                "part letters, digits, '-', '_' and '.' (not starting or ending with "
                "'-' or '.'), at most 96 characters, e.g. my-org/clip-finetuned"
            )


#: Fields that change no training step: evaluation-only sets and options, loading, logging,
#: output, and how far to train (--epochs, --max-steps: a finished run may be continued with
#: `--resume latest --max-steps N`; a linear or cosine schedule then follows the new length).
#: Every other field of `data` and `optim`, and `FINGERPRINT_RUN` of `run`, make the training
#: fingerprint. (--real-val-split is in it: the checkpoint's best validation loss was measured on it.)
NOT_IN_FINGERPRINT = {
    "data": {"num_workers", "real_test_split", "zeroshot", "flickr30k", "flickr30k_split", "max_image_pixels"},
    # --loss follows --model (training/losses.py `resolve_loss`: the other choice is refused), and
    # run.json records the loss the model resolved to where the command may have left it out.
    "optim": {"epochs", "max_steps", "grad_checkpointing", "loss"},
}
#: The model trained and the batch order.
FINGERPRINT_RUN = ("backend", "model", "pretrained", "seed")


def training_fingerprint(config: dict) -> dict[str, Any]:
    """`--flag` -> value of the fields of `config` (an `as_dict` view, with local paths named by
    content as run.json names them) that change the training; a checkpoint records it and
    `--resume` refuses a checkpoint of another one. A dataset is its two flags `--NAME` and
    `--NAME-revision`."""
    out: dict[str, Any] = {}
    for section, values in config.items():
        if section not in ("data", "optim", "run"):
            continue
        for name, value in values.items():
            if name in NOT_IN_FINGERPRINT.get(section, ()) or (section == "run" and name not in FINGERPRINT_RUN):
                continue
            flag = "--" + name.replace("_", "-")
            if isinstance(value, dict):  # a SourceRef
                out[flag], out[f"{flag}-revision"] = value.get("path"), value.get("revision")
            else:
                out[flag] = value
    return out


def as_dict(cfg: Any) -> Any:
    """Plain JSON-able view of a config (for the run record and the model card)."""
    if hasattr(cfg, "__dataclass_fields__"):
        return {f.name: as_dict(getattr(cfg, f.name)) for f in fields(cfg)}
    if isinstance(cfg, tuple):
        return list(cfg)
    return cfg
