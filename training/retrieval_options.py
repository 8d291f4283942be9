"""`--first-stage` and `--rerank-k`: how a cross-encoder ranks (training/rerank.py), one definition
given to `counterfactory benchmark` (builders/app/benchmark_cli.py) and to the trainer
(training/options.py: `counterfactory train`, `accelerate launch training/finetune_clip.py`).
Light: no torch, so `--help` stays instant."""

from __future__ import annotations

import argparse

from builders.engine.option_types import positive_int
from builders.models.families import DEFAULT_K


def add_retrieval_arguments(parser: argparse.ArgumentParser, scored: str, fixed: str = "") -> None:
    """The two flags; `scored` names the sets a first stage ranks, `fixed` adds what the command
    does with it (the trainer: it is never trained)."""
    parser.add_argument(
        "--first-stage",
        default=None,
        metavar="MODEL",
        help="a CLIP (id or folder), or a model with contrastive embeddings (BLIP, FLAVA, "
        "BridgeTowerForContrastiveLearning), whose top k a cross-encoder without a dual encoder of "
        f"its own (ViLT, BridgeTower's ITM head) re-ranks by its ITM score on {scored}; without it "
        "those get no retrieval metrics (their ITM deltas still run). BLIP re-ranks its own ITC top "
        f"k, FLAVA and BridgeTowerForContrastiveLearning rank by their contrastive embeddings{fixed}",
    )
    parser.add_argument(
        "--rerank-k",
        type=positive_int,
        default=DEFAULT_K,
        metavar="K",
        help="candidates a query a cross-encoder re-ranks, capped at the gallery size (default 256, "
        "BLIP's COCO k_test); recorded with every retrieval number",
    )
