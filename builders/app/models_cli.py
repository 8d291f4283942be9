"""`counterfactory models tiny DIR | list`."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path


def _tiny(args: argparse.Namespace) -> int:
    from builders.models.tiny import build_tiny_models
    from builders.models.tiny_families import build_tiny_families

    # The cross-encoder families in a folder of their own (their own version): adding one never
    # rebuilds the models every other role uses.
    roles = {**build_tiny_models(args.dir), **build_tiny_families(args.dir / "families")}
    for role, path in roles.items():
        print(f"{role:12s} {path}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from builders.models.profiles import PRODUCTION

    for role, model_id in asdict(PRODUCTION).items():
        print(f"{role:12s} {model_id}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("models", help="model profiles (tiny offline models, production ids)")
    sub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    tiny = sub.add_parser(
        "tiny",
        help="build the tiny random-init models into DIR",
        description="Build tiny random-init models of every role (CLIP, open_clip, "
        "SD, SD inpainting, RoBERTa MLM, GPT-2, BLIP captioner; the scored families BLIP ITM, "
        "BridgeTower, ViLT and FLAVA under DIR/families) loadable with the "
        "same from_pretrained/open_clip calls as the real ones. Idempotent.",
    )
    tiny.add_argument("dir", type=Path, help="output folder")
    tiny.set_defaults(func=_tiny)
    lst = sub.add_parser("list", help="print the production model id of every role")
    lst.set_defaults(func=_list)
