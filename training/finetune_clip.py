"""Finetune CLIP on our datasets and evaluate it with our metrics.

    accelerate launch training/finetune_clip.py --real ORG/coco-captions --real-revision v1.0.0 \
        --decorrelation ORG/decorrelation --decorrelation-revision v1.0.0 --mix decorrelation \
        --ratio 0.1 --recipe kim2023 --output runs/kim2023
    python training/finetune_clip.py ...   # the same, one process (= `counterfactory train ...`)
    # the pretrained baseline's ITM deltas on a counterfactual set it is not trained on (so are
    # `--mix none|decorrelation` runs given --counterfactuals: every pair of the split is scored)
    python training/finetune_clip.py --real ORG/coco-captions --counterfactuals ORG/cf \
        --counterfactuals-split test --eval-only --output runs/baseline

`--help` lists every flag (training/options.py); docs/training.md has worked examples. Input
errors are printed as one line (exit status 2) before training starts.
"""

from __future__ import annotations

import argparse
import sys

from builders.engine.errors import run_handled
from training.options import build_parser, config_from_args


def train(args: argparse.Namespace) -> int:
    """The handler of this script and of `counterfactory train`."""
    from training.trainer import run

    run(config_from_args(args))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.set_defaults(func=train)
    return run_handled(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
