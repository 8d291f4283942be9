"""The flags of the trainer and of the seed sweep, generated from the config's fields.

Each field of `TrainConfig`'s sections (training/config.py) is the flag `--FIELD-NAME`, made by the
engine's generator as every builder's (`builders.engine.options`: a bool is a switch, a `Literal`
the choices, a tuple `nargs="+"`), plus a `SourceRef` field as the pair `--NAME` /
`--NAME-revision`. Every flag defaults to None so that `config_from_args` sees what was given:
dataclass defaults < `--recipe` < flags.

`accelerate launch training/finetune_clip.py`, `python training/sweep.py`, `counterfactory
train` and `counterfactory sweep` build their parsers here. Light: no torch, so `--help` is instant.
"""

from __future__ import annotations

import argparse
from dataclasses import Field, replace
from pathlib import Path

from builders.engine.options import add_config_arguments, add_field, config_fields, dest_of, flag_of, sections
from training.config import RECIPES, SourceRef, TrainConfig
from training.retrieval_options import add_retrieval_arguments

TRAIN_DESCRIPTION = (
    "Finetune CLIP on our datasets (by repo id + revision or build folder) and evaluate it with the project's metrics."
)
SWEEP_DESCRIPTION = (
    "Several seeds of one finetuning command, mean ± std per metric, and a "
    "one-tailed Welch t-test against a baseline sweep (the COCO-Counterfactuals "
    "paper's protocol: 25 seeds, 107-131 with data seeds 108-132, Le et al. 2023 "
    "§5.1)."
)
#: Help group title of each section of `TrainConfig`.
_GROUPS = {"data": "data", "optim": "optimisation", "run": "run"}


def _add_source_ref(group: argparse._ActionsContainer, f: Field) -> None:
    """A `SourceRef` field is the pair `--NAME REPO_OR_DIR` / `--NAME-revision REV`."""
    group.add_argument(flag_of(f), metavar="REPO_OR_DIR", default=None, help=f.metadata["help"])
    group.add_argument(
        f"{flag_of(f)}-revision", metavar="REV", default=None, help=f"tag, branch or commit of {flag_of(f)}"
    )


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Every field's flag, plus `--models tiny` (the tests' tiny CLIP) and the benchmark's
    `--first-stage` / `--rerank-k` (training/retrieval_options.py)."""
    for f, hint in config_fields(TrainConfig):
        if f.name not in _GROUPS:
            add_field(parser, f, hint)
    parser.add_argument(
        "--models",
        choices=("production", "tiny"),
        default=None,
        help="`tiny`: the project's tiny random-init CLIP (tests); sets --model",
    )
    parser.add_argument(
        "--tiny-models-dir",
        default=None,
        help="where the tiny models are built/cached (default $COUNTERFACTORY_CACHE/tiny_models)",
    )
    fixed = "; the first stage is never trained: the same weights pick the candidates before and after"
    add_retrieval_arguments(parser, "--real's test split and --decorrelation's ODmAP sets", fixed)
    for f, cls in sections(TrainConfig):
        add_config_arguments(parser, cls, group=_GROUPS[f.name], adders={SourceRef: _add_source_ref})


def build_parser(prog: str = "finetune_clip.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=TRAIN_DESCRIPTION)
    add_train_arguments(parser)
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The run configuration the flags describe, checked (`TrainConfig.check`)."""
    cfg = TrainConfig(recipe=args.recipe)
    if args.recipe:
        for section, values in RECIPES[args.recipe].items():
            setattr(cfg, section, replace(getattr(cfg, section), **values))
    for section, cls in sections(TrainConfig):
        for f, hint in config_fields(cls):
            value = getattr(args, dest_of(f))
            if value is None:
                continue
            if hint is SourceRef:
                value = SourceRef(value, getattr(args, f"{f.name}_revision"))
            elif isinstance(value, list):
                value = tuple(value)
            setattr(getattr(cfg, section.name), f.name, value)
    cfg.run.first_stage, cfg.run.rerank_k = args.first_stage, args.rerank_k
    if args.models == "tiny":
        from builders.models.profiles import tiny_profile

        profile = tiny_profile(Path(args.tiny_models_dir) if args.tiny_models_dir else None)
        if args.model is None and cfg.run.backend in ("blip", "bridgetower"):
            from builders.models.tiny_families import build_tiny_families

            tiny = Path(profile.clip).parent / "families"  # `counterfactory models tiny DIR`'s layout
            cfg.run.model = str(build_tiny_families(tiny)[cfg.run.backend])
        elif args.model is None:
            cfg.run.model = profile.open_clip if cfg.run.backend == "open_clip" else profile.clip
    cfg.check()
    # Concrete names, so run.json and the model card say which weights were the start.
    cfg.run.model, cfg.run.pretrained = cfg.run.weights()
    return cfg


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", help="107-131 or 1,2,5 (needed unless --summarize-only)")
    parser.add_argument(
        "--data-seed-offset",
        type=int,
        default=None,
        help="data seed = seed + offset (the paper: 1); default: the command's --data-seed",
    )
    parser.add_argument("--output", required=True, help="sweep folder: OUTPUT/seed-N, OUTPUT/summary.*")
    parser.add_argument(
        "--baseline",
        default=None,
        help="a finished sweep folder to test against (e.g. the same sweep with "
        "--mix cf:real, the real-only baseline)",
    )
    parser.add_argument(
        "--summarize-only",
        action="store_true",
        help="only rewrite the summary of every seed finished under --output (no --seeds)",
    )
    parser.add_argument(
        "train_args",
        nargs="*",
        metavar="TRAIN_FLAG",
        help="after `--`: the training flags of every seed (see `finetune_clip.py "
        "--help`; each seed sets --seed and --output, and with --data-seed-offset --data-seed)",
    )


def build_sweep_parser(prog: str = "sweep.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=SWEEP_DESCRIPTION)
    add_sweep_arguments(parser)
    return parser
