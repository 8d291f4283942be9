"""`counterfactory nltk offline-tagger|check`: NLTK data for noun-phrase chunking."""

from __future__ import annotations

import argparse
from pathlib import Path


def _offline(args: argparse.Namespace) -> int:
    from builders.engine.nltk_setup import default_nltk_data, install_offline_tagger

    target = install_offline_tagger(args.nltk_data or default_nltk_data())
    print(f"offline caption tagger installed in {target}; NLTK finds it there by default")
    return 0


def _check(args: argparse.Namespace) -> int:
    from builders.engine.nltk_setup import tagger_info

    print(", ".join(f"{k}: {v}" for k, v in tagger_info().items()))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("nltk", help="NLTK tagger data (real download or offline tagger)")
    sub = p.add_subparsers(dest="nltk_command", metavar="ACTION", required=True)
    off = sub.add_parser(
        "offline-tagger",
        help="train the small caption tagger for machines without internet",
        description="Train NLTK's perceptron tagger on the shipped hand-tagged caption corpus and "
        "save it as averaged_perceptron_tagger_eng where NLTK looks for it (the folder NLTK's own "
        "downloader would use), so every later command finds it without settings. A real tagger "
        "already there is left alone. With internet, prefer the real data: "
        "python -m nltk.downloader averaged_perceptron_tagger_eng",
    )
    off.add_argument(
        "--nltk-data",
        type=Path,
        default=None,
        help="NLTK data folder (default: the first folder of $NLTK_DATA, else NLTK's "
        "download folder, usually ~/nltk_data)",
    )
    off.set_defaults(func=_offline)
    chk = sub.add_parser("check", help="say which tagger nltk.pos_tag will use (error if none)")
    chk.set_defaults(func=_check)
