"""`counterfactory nltk offline-tagger|check`: NLTK data for noun-phrase chunking."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def _offline(args: argparse.Namespace) -> int:
    from builders.infra.text.nltk_setup import install_offline_tagger

    target = install_offline_tagger(args.nltk_data)
    print(f"offline caption tagger installed in {target}; use it with "
          f"export NLTK_DATA={Path(args.nltk_data).resolve()}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from builders.infra.text.nltk_setup import tagger_info

    print(", ".join(f"{k}: {v}" for k, v in tagger_info().items()))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("nltk", help="NLTK tagger data (real download or offline tagger)")
    sub = p.add_subparsers(dest="nltk_command", metavar="ACTION", required=True)
    off = sub.add_parser(
        "offline-tagger", help="train the small caption tagger for machines without internet",
        description="Train NLTK's perceptron tagger on the shipped hand-tagged caption corpus and "
        "save it as averaged_perceptron_tagger_eng under --nltk-data. With internet, prefer the "
        "real data: python -m nltk.downloader averaged_perceptron_tagger_eng")
    # NLTK_DATA may list several folders (like PATH); NLTK searches them in order.
    default = (os.environ.get("NLTK_DATA") or ".nltk_data").split(os.pathsep)[0]
    off.add_argument("--nltk-data", type=Path, default=Path(default),
                     help="NLTK data folder (default: the first folder of $NLTK_DATA, else ./.nltk_data)")
    off.set_defaults(func=_offline)
    chk = sub.add_parser("check", help="say which tagger nltk.pos_tag will use (error if none)")
    chk.set_defaults(func=_check)
