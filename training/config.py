"""Typed run configuration of `training/finetune_clip.py`, the paper recipes, and the CLI flags.

Precedence: dataclass defaults < `--recipe` preset < flags given on the command line, so every
field of a recipe can be overridden (`--recipe kim2023 --epochs 1`).

Recipes (the papers' finetuning set-ups):

- `kim2023` (object decorrelation, Kim et al. 2023 §4.1 / builders/decorrelation/METHOD.md §6):
  10 epochs, batch 256, Adam, lr 2e-6, lr x 0.5 every 2 epochs.
- `le2023` (COCO-Counterfactuals, Le et al. 2023 §5 / builders/counterfactuals/METHOD.md §5):
  AdamW, lr 5e-7, weight decay 0.001, batch 128, best checkpoint by validation loss.

Example:
    >>> cfg = config_from_args(build_parser().parse_args(
    ...     ["--real", "out/coco-captions", "--output", "run", "--recipe", "kim2023", "--epochs", "1"]))
    >>> cfg.optim.lr, cfg.optim.epochs, cfg.optim.batch_size
    (2e-06, 1, 256)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from builders.engine.errors import UserFacingError

MIXES = ("none", "decorrelation", "cf:base", "cf:medium", "cf:all")
HARD_NEGATIVES = ("none", "pairs", "negclip")
BACKENDS = ("transformers", "open_clip")
#: Backend -> (model, pretrained tag) when --model is not given: CLIP ViT-B/32 with OpenAI's
#: weights in both (open_clip names the architecture and the weights separately).
DEFAULT_MODELS: dict[str, tuple[str, str | None]] = {
    "transformers": ("openai/clip-vit-base-patch32", None),
    "open_clip": ("ViT-B-32", "openai"),
}


@dataclass
class SourceRef:
    """One of our datasets: a Hub repo id or a local build folder, at a revision (tag/branch/sha)."""

    path: str
    revision: str | None = None


@dataclass
class DataConfig:
    """What to train and evaluate on. Example: `DataConfig(real=SourceRef("org/coco-captions",
    "v1.0.0"), decorrelation=SourceRef("org/decorrelation", "v1.0.0"), mix="decorrelation",
    ratio=0.1)`."""

    #: The real pairs D: a `coco-captions` build (its `default` config, one row per image).
    real: SourceRef | None = None
    #: Karpathy splits of D used for training (the paper's "train" is train + restval).
    real_train_splits: tuple[str, ...] = ("train", "restval")
    #: Split of D for validation (loss) with `--mix none|decorrelation`; None: no validation.
    real_val_split: str | None = "val"
    #: Split of D for retrieval evaluation (COCO 5K/1K protocol: 5 captions per image).
    real_test_split: str | None = "test"
    #: The decorrelation build: D' (`default/train`) and the ODmAP@k sets (`odmap_*`/`test`).
    decorrelation: SourceRef | None = None
    #: A COCO-Counterfactuals build (`default` rows image_0/image_1/caption_0/caption_1).
    counterfactuals: SourceRef | None = None
    #: Split of the counterfactuals build to read (default: the one split `counterfactory build
    #: coco-counterfactuals` publishes, like the original release): the `cf:` mixtures train on
    #: 80 % of it; with another mix all of it is held out for the ITM deltas (training/mixtures.py).
    counterfactuals_split: str = "test"
    mix: str = "none"
    #: |D'_sub| / |D| for `--mix decorrelation` (None: all of D').
    ratio: float | None = None
    #: Seed of every data choice: mixture sampling, 80/20 split (not the batch order).
    data_seed: int = 0
    hard_negatives: str = "none"
    #: DataLoader workers decoding the parquet image bytes.
    num_workers: int = 2


@dataclass
class OptimConfig:
    """Optimisation. Example: `OptimConfig(lr=2e-6, epochs=10, batch_size=256, schedule="step")`."""

    epochs: int = 1
    #: Global batch (all processes, one optimizer step before accumulation).
    batch_size: int = 64
    grad_accum: int = 1
    optimizer: Literal["adam", "adamw"] = "adamw"
    lr: float = 1e-5
    weight_decay: float = 0.0
    #: constant | cosine | step (x step_gamma every step_epochs epochs)
    schedule: Literal["constant", "cosine", "step"] = "constant"
    warmup_steps: int = 0
    step_epochs: int = 2
    step_gamma: float = 0.5
    max_grad_norm: float | None = None
    #: Stop after this many optimizer steps (None: run all epochs).
    max_steps: int | None = None
    lock_image: bool = False
    lock_text: bool = False
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"


@dataclass
class RunConfig:
    """Where and how the run goes. Example: `RunConfig(output="runs/a", seed=107)`."""

    output: str = "runs/finetune"
    backend: str = "transformers"
    #: None: DEFAULT_MODELS[backend].
    model: str | None = None
    #: open_clip weights tag of an architecture name (`--model ViT-B-32 --pretrained openai`).
    pretrained: str | None = None
    seed: int = 0
    #: Evaluate every N optimizer steps (0: only per epoch and at the end).
    eval_every: int = 0
    #: Save accelerate state every N optimizer steps (0: only per epoch).
    save_every: int = 0
    #: Keep the checkpoint with the lowest validation loss as the final model.
    best_by_val_loss: bool = False
    resume: str | None = None
    eval_only: bool = False
    #: Fail at start-up unless this many processes were launched.
    expect_processes: int | None = None
    push_to_hub: str | None = None
    eval_batch_size: int = 64
    #: ODmAP@k / R@K cut-offs.
    k_values: tuple[int, ...] = (1, 5, 10)
    #: Also run the ECCV Caption suite (needs the real COCO 5K test split).
    eccv: bool = False
    log_every: int = 1

    def weights(self) -> tuple[str, str | None]:
        """(model, pretrained tag) with the backend's defaults filled in."""
        if self.model is not None:
            return self.model, self.pretrained
        model, tag = DEFAULT_MODELS[self.backend]
        return model, self.pretrained or tag

    def model_id(self) -> str:
        """What the backend loads: `ARCH:TAG` for an open_clip architecture with a tag."""
        model, tag = self.weights()
        return f"{model}:{tag}" if tag else model


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    recipe: str | None = None

    def check(self) -> None:
        """Option errors that need no data: raised before anything is loaded."""
        d, o, r = self.data, self.optim, self.run
        if d.mix not in MIXES:
            raise UserFacingError(f"--mix {d.mix!r} is unknown; choose one of {', '.join(MIXES)}")
        if d.hard_negatives not in HARD_NEGATIVES:
            raise UserFacingError(f"--hard-negatives {d.hard_negatives!r} is unknown; choose one of "
                                  f"{', '.join(HARD_NEGATIVES)}")
        if r.backend not in BACKENDS:
            raise UserFacingError(f"--backend {r.backend!r} is unknown; choose one of {', '.join(BACKENDS)}")
        if r.pretrained is not None and r.backend != "open_clip":
            raise UserFacingError("--pretrained names open_clip weights; with --backend transformers "
                                  "give the checkpoint as --model (Hub id or folder)")
        if r.pretrained is not None and r.model is not None and (":" in r.model or Path(r.model).is_dir()):
            raise UserFacingError(f"--model {r.model} already says which weights to load, so --pretrained "
                                  f"{r.pretrained} cannot apply; give an architecture name (ViT-B-32) "
                                  "or drop --pretrained")
        if d.real is None and (not r.eval_only or d.mix.startswith("cf:")):
            raise UserFacingError("--real is required: the coco-captions build (folder or repo id) "
                                  "holding the real pairs D and their images")
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
        if r.eccv and (d.real is None or not d.real_test_split):
            raise UserFacingError("--eccv scores the COCO 5K test split: give --real (a coco-captions "
                                  "build) and --real-test-split test")


#: Recipe name -> {section: {field: value}}.
RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "kim2023": {"optim": {"epochs": 10, "batch_size": 256, "optimizer": "adam", "lr": 2e-6,
                          "weight_decay": 0.0, "schedule": "step", "step_epochs": 2,
                          "step_gamma": 0.5}},
    "le2023": {"optim": {"optimizer": "adamw", "lr": 5e-7, "weight_decay": 0.001,
                         "batch_size": 128},
               "run": {"best_by_val_loss": True, "eval_batch_size": 128}},
}

# flag -> (section, field, argparse kwargs). Defaults are None so "not given" is visible.
_FLAGS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("--real-train-splits", "data", "real_train_splits", {"nargs": "+"}),
    ("--real-val-split", "data", "real_val_split", {}),
    ("--real-test-split", "data", "real_test_split", {}),
    ("--counterfactuals-split", "data", "counterfactuals_split", {}),
    ("--mix", "data", "mix", {"choices": MIXES}),
    ("--ratio", "data", "ratio", {"type": float}),
    ("--data-seed", "data", "data_seed", {"type": int}),
    ("--hard-negatives", "data", "hard_negatives", {"choices": HARD_NEGATIVES}),
    ("--num-workers", "data", "num_workers", {"type": int}),
    ("--epochs", "optim", "epochs", {"type": int}),
    ("--batch-size", "optim", "batch_size", {"type": int}),
    ("--grad-accum", "optim", "grad_accum", {"type": int}),
    ("--optimizer", "optim", "optimizer", {"choices": ("adam", "adamw")}),
    ("--lr", "optim", "lr", {"type": float}),
    ("--weight-decay", "optim", "weight_decay", {"type": float}),
    ("--schedule", "optim", "schedule", {"choices": ("constant", "cosine", "step")}),
    ("--warmup-steps", "optim", "warmup_steps", {"type": int}),
    ("--step-epochs", "optim", "step_epochs", {"type": int}),
    ("--step-gamma", "optim", "step_gamma", {"type": float}),
    ("--max-grad-norm", "optim", "max_grad_norm", {"type": float}),
    ("--max-steps", "optim", "max_steps", {"type": int}),
    ("--lock-image", "optim", "lock_image", {"action": "store_const", "const": True}),
    ("--lock-text", "optim", "lock_text", {"action": "store_const", "const": True}),
    ("--mixed-precision", "optim", "mixed_precision", {"choices": ("no", "fp16", "bf16")}),
    ("--output", "run", "output", {}),
    ("--backend", "run", "backend", {"choices": BACKENDS}),
    ("--model", "run", "model", {}),
    ("--pretrained", "run", "pretrained", {"metavar": "TAG"}),
    ("--seed", "run", "seed", {"type": int}),
    ("--eval-every", "run", "eval_every", {"type": int}),
    ("--save-every", "run", "save_every", {"type": int}),
    ("--best-by-val-loss", "run", "best_by_val_loss", {"action": "store_const", "const": True}),
    ("--resume", "run", "resume", {}),
    ("--eval-only", "run", "eval_only", {"action": "store_const", "const": True}),
    ("--expect-processes", "run", "expect_processes", {"type": int}),
    ("--push-to-hub", "run", "push_to_hub", {"metavar": "ORG/NAME"}),
    ("--eval-batch-size", "run", "eval_batch_size", {"type": int}),
    ("--k-values", "run", "k_values", {"type": int, "nargs": "+"}),
    ("--eccv", "run", "eccv", {"action": "store_const", "const": True}),
    ("--log-every", "run", "log_every", {"type": int}),
]


_HELP = {
    "--real-train-splits": "splits of --real to train on (cf: mixes: where the real images are found)",
    "--real-val-split": "split of --real for the validation loss ('' for none; cf: mixes hold out 20%%)",
    "--real-test-split": "split of --real for R@K (all 5 captions per image; '' to skip)",
    "--counterfactuals-split": "split of the --counterfactuals build to read (all of it is scored "
                               "when no cf: mix trains on it)",
    "--mix": "none: D; decorrelation: D + D'_sub; cf:base|medium|all: COCO-Counterfactuals mixtures",
    "--ratio": "|D'_sub| / |D| for --mix decorrelation (default: all of D')",
    "--data-seed": "seed of the mixture sampling and the 80/20 split",
    "--hard-negatives": "pairs: both rows of a pair in one batch; negclip: extra i2t text negatives",
    "--num-workers": "DataLoader workers decoding images",
    "--batch-size": "global batch (all processes together)",
    "--grad-accum": "batches per optimizer step",
    "--schedule": "lr after warm-up (step: x --step-gamma every --step-epochs epochs)",
    "--max-steps": "stop after this many optimizer steps",
    "--lock-image": "freeze the image tower",
    "--lock-text": "freeze the text tower",
    "--output": "run folder (checkpoints, metrics, final model)",
    "--backend": "transformers (CLIPModel) or open_clip",
    "--model": "Hub id or folder (transformers; default openai/clip-vit-base-patch32); ARCH, "
               "ARCH:TAG, hf-hub:..., local-dir:PATH (open_clip; default ViT-B-32 + --pretrained openai)",
    "--pretrained": "open_clip weights tag of an architecture --model (ViT-B-32: openai, laion2b_s34b_b79k, ...)",
    "--seed": "training seed (batch order)",
    "--eval-every": "evaluate every N steps (default: every epoch)",
    "--save-every": "checkpoint every N steps (and always per epoch)",
    "--best-by-val-loss": "final model = the evaluation with the lowest validation loss",
    "--eval-only": "only evaluate --model (e.g. the pretrained baseline)",
    "--expect-processes": "fail unless this many processes were launched",
    "--push-to-hub": "upload the final model + card to this model repo",
    "--k-values": "K of R@K and ODmAP@K",
    "--eccv": "also the ECCV Caption suite (needs the COCO 5K test split)",
    "--resume": "`latest` (newest checkpoint under --output) or a checkpoint folder",
}


_SOURCE_HELP = {
    "real": "the coco-captions build (repo id or folder): D and the retrieval test split",
    "decorrelation": "the decorrelation build (repo id or folder): D' and the ODmAP@k sets",
    "counterfactuals": "a coco-counterfactuals build (repo id or folder): --mix cf:* train on it and "
                       "hold out 20%% for the ITM deltas; with --mix none|decorrelation it is not "
                       "trained on and every pair of --counterfactuals-split is scored (IR_c, TR_c), "
                       "also with --eval-only",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="finetune_clip.py",
        description="Finetune CLIP on our datasets (by repo id + revision or build folder) and "
                    "evaluate it with the project's metrics.")
    p.add_argument("--recipe", choices=sorted(RECIPES), help="paper preset; flags override it")
    for name in ("real", "decorrelation", "counterfactuals"):
        p.add_argument(f"--{name}", metavar="REPO_OR_DIR", help=_SOURCE_HELP[name])
        p.add_argument(f"--{name}-revision", metavar="REV", help="tag, branch or commit")
    p.add_argument("--models", choices=("production", "tiny"), default=None,
                   help="`tiny`: the project's tiny random-init CLIP (tests); sets --model")
    p.add_argument("--tiny-models-dir", default=None)
    for flag, _section, _name, kwargs in _FLAGS:
        p.add_argument(flag, default=None, help=_HELP.get(flag), **kwargs)
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    cfg = TrainConfig(recipe=args.recipe)
    if args.recipe:
        for section, values in RECIPES[args.recipe].items():
            setattr(cfg, section, replace(getattr(cfg, section), **values))
    for flag, section, name, _ in _FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            setattr(getattr(cfg, section), name, tuple(value) if isinstance(value, list) else value)
    for name in ("real", "decorrelation", "counterfactuals"):
        path = getattr(args, name)
        if path is not None:
            setattr(cfg.data, name, SourceRef(path, getattr(args, f"{name}_revision")))
    if args.models == "tiny":
        from builders.models.profiles import tiny_profile

        profile = tiny_profile(Path(args.tiny_models_dir) if args.tiny_models_dir else None)
        if args.model is None:
            cfg.run.model = profile.open_clip if cfg.run.backend == "open_clip" else profile.clip
    cfg.check()
    # Concrete names, so run.json and the model card say which weights were the start.
    cfg.run.model, cfg.run.pretrained = cfg.run.weights()
    return cfg


def as_dict(cfg: Any) -> Any:
    """Plain JSON-able view of a config (for the run record and the model card)."""
    if hasattr(cfg, "__dataclass_fields__"):
        return {f.name: as_dict(getattr(cfg, f.name)) for f in fields(cfg)}
    if isinstance(cfg, tuple):
        return list(cfg)
    return cfg
