"""`counterfactory build <dataset>`: the table of builders.

Each registered module (`builders/<dataset>/options.py`) exposes `add_arguments(parser)`,
`config_from_args(args)` and a one-line `HELP`; its flags are the fields of the dataset's config
(`builders.engine.options`). It must import no heavy library (torch, datasets,
NLTK, ...) at module level, because `counterfactory --help` builds every parser
(tests/app/test_help_imports.py checks), and never imports its builder. The builder, made by
`builders/<dataset>/builder.py`'s `from_args`, is imported here only when a build runs.
`builder.py` is the `accelerate launch` entry point and hands the same options module and
`from_args` to `builders.launch.launch_main`, so `counterfactory build X ...` and `accelerate
launch builders/<dataset>/builder.py ...` run identical code.
"""

from __future__ import annotations

import argparse
import importlib

from builders.launch import add_builder_parser

BUILDER_MODULES = {
    "coco-captions": "builders.coco_captions.options",
    "decorrelation": "builders.decorrelation.options",
    "coco-counterfactuals": "builders.counterfactuals.options",
    "eccv-positives": "builders.eccv_positives.options",
}


def _builder_from_args(options_module: str):
    """The `from_args` of the options module's sibling `builder.py`, imported when it runs."""

    def build(args: argparse.Namespace):
        return importlib.import_module(options_module.rpartition(".")[0] + ".builder").from_args(args)

    return build


def register(subparsers: argparse._SubParsersAction) -> None:
    build = subparsers.add_parser("build", help="build a dataset (resumable, shardable)")
    kinds = build.add_subparsers(dest="dataset", metavar="DATASET", required=True)
    for name, module_name in BUILDER_MODULES.items():
        module = importlib.import_module(module_name)
        add_builder_parser(
            kinds.add_parser(name, help=module.HELP, description=module.HELP), module, _builder_from_args(module_name)
        )
