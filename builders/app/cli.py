"""The `counterfactory` command line.

Each subcommand lives in the module that implements it; that module exposes
`register(subparsers)` which adds its parser and sets `func` (a callable taking the parsed
namespace and returning an exit code). Heavy libraries are imported inside the handlers so that
`counterfactory --help` and every subcommand's `--help` stay instant: building the parser imports
no torch, datasets, NLTK, transformers, ... (tests/app/test_help_imports.py checks; CPU times:
`python benchmarks/cli_startup.py`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from builders import __version__
from builders.engine.errors import run_handled

# Order is the order shown in --help.
SUBCOMMAND_MODULES = (
    "builders.app.fixtures_cli",
    "builders.app.models_cli",
    "builders.app.nltk_cli",
    "builders.app.registry",
    "builders.app.renderings_cli",
    "builders.eccv_positives.mitl.cli",
    "builders.app.publish_cli",
    "builders.app.metric_cli",
    "builders.app.local_hub_cli",
    "builders.app.show_cli",
    "builders.app.train_cli",
    "builders.app.doctor_cli",
    "builders.app.benchmark_cli",
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


if __name__ == "__main__":
    sys.exit(main())
