"""The `counterfactory` command line.

Each subcommand lives in the module that implements it; that module exposes
`register(subparsers)` which adds its parser and sets `func` (a callable taking the parsed
namespace and returning an exit code). Heavy libraries are imported inside the handlers so that
`counterfactory --help` and every subcommand's `--help` stay instant: building the parser imports
no torch, datasets, NLTK, transformers, ... (tests/test_help_imports.py checks; CPU times:
`python benchmarks/cli_startup.py`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from builders import __version__
from builders.infra.errors import UserFacingError

# Order is the order shown in --help.
SUBCOMMAND_MODULES = (
    "builders.infra.fixtures.cli",
    "builders.infra.models.cli",
    "builders.infra.text.nltk_cli",
    "builders.registry",
    "builders.eccv_positives.cli",
    "builders.infra.publishing.cli",
    "builders.infra.publishing.metric_cli",
    "builders.infra.local_hub_cli",
    "builders.infra.gallery.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="counterfactory",
        description="Build, publish and evaluate counterfactual image-text retrieval datasets.",
    )
    parser.add_argument("--version", action="version", version=f"counterfactory {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_handled(build_parser(), argv)


def run_handled(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse, set up logging, run the handler; user errors become one line and exit code 2."""
    args = parser.parse_args(argv)
    if not hasattr(args, "verbose"):
        args.verbose = False
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # The Hub client logs every HTTP request at INFO: noise unless asked for with -v.
    logging.getLogger("httpx2").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except UserFacingError as err:
        # One clear line naming the file/row and the fix; no traceback for user mistakes.
        print(f"counterfactory: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
