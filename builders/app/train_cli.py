"""`counterfactory train ...` and `counterfactory sweep ... -- TRAIN_FLAGS`: CLIP finetuning and a
seed sweep (training/), the same code and flags as `accelerate launch training/finetune_clip.py`
and `python training/sweep.py`. Registering imports only the light flag table
(training/options.py); the handlers import the trainer."""

from __future__ import annotations

import argparse


def _train(args: argparse.Namespace) -> int:
    from training.finetune_clip import train

    return train(args)


def _sweep(args: argparse.Namespace) -> int:
    from training.sweep import sweep

    return sweep(args)


def register(subparsers: argparse._SubParsersAction) -> None:
    from training.options import SWEEP_DESCRIPTION, TRAIN_DESCRIPTION, add_sweep_arguments, add_train_arguments

    train = subparsers.add_parser(
        "train",
        help="finetune CLIP on our datasets and evaluate it (one process; several: "
        "`accelerate launch training/finetune_clip.py`)",
        description=TRAIN_DESCRIPTION,
    )
    add_train_arguments(train)
    train.set_defaults(func=_train)
    sweep = subparsers.add_parser(
        "sweep",
        help="one training run per seed, mean ± std and a Welch t-test against a baseline sweep",
        description=SWEEP_DESCRIPTION,
    )
    add_sweep_arguments(sweep)
    sweep.set_defaults(func=_sweep)
