"""Finetune CLIP on our datasets and evaluate it with our metrics.

    accelerate launch training/finetune_clip.py --real ORG/coco-captions --real-revision v1.0.0 \
        --decorrelation ORG/decorrelation --decorrelation-revision v1.0.0 --mix decorrelation \
        --ratio 0.1 --recipe kim2023 --output runs/kim2023
    python training/finetune_clip.py ...   # the same, one process
    # the pretrained baseline's ITM deltas on a counterfactual set it is not trained on (so are
    # `--mix none|decorrelation` runs given --counterfactuals: every pair of the split is scored)
    python training/finetune_clip.py --real ORG/coco-captions --counterfactuals ORG/cf \
        --counterfactuals-split test --eval-only --output runs/baseline

`--help` lists every flag; README "Training" has worked examples. Input errors are printed as one
line (exit status 2) before training starts.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

try:
    import training  # noqa: F401
except ImportError:  # run as a script from a checkout whose install predates `training/`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from builders.engine.errors import UserFacingError  # noqa: E402
from training.config import build_parser, config_from_args  # noqa: E402

log = logging.getLogger("training")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from training.trainer import run

        run(config_from_args(build_parser().parse_args(argv)))
    except UserFacingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
