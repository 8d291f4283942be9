"""`counterfactory build <dataset>`: options every builder shares, and the builder registry.

Each registered module (`builders/<dataset>/options.py`) exposes `add_arguments(parser)`,
`from_args(args) -> ShardedBuilder` and a one-line `HELP`. It must import no heavy library (torch,
datasets, NLTK, ...) at module level, because `counterfactory --help` builds every parser
(tests/test_help_imports.py checks); `from_args` imports the builder itself.
`builders/<dataset>/builder.py` is the `accelerate launch` entry point and hands the same options
module to `launch_main`, so `counterfactory build X ...` and `accelerate launch
builders/<dataset>/builder.py ...` run identical code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path
from types import ModuleType

from builders.infra.option_types import fraction, positive_int

BUILDER_MODULES = {
    "coco-captions": "builders.coco_captions.options",
    "decorrelation": "builders.decorrelation.options",
    "coco-counterfactuals": "builders.counterfactuals.options",
    "eccv-positives": "builders.eccv_positives.options",
}


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `RunConfig` (how the build runs, as opposed to what it builds)."""
    group = parser.add_argument_group("run")
    group.add_argument("--output", type=Path, required=True, help="output folder (Hub layout)")
    group.add_argument("--part-size", type=positive_int, default=64,
                       help="work items per resumable part (fixed for a build; default 64)")
    group.add_argument("--max-shard-bytes", type=positive_int, default=500_000_000,
                       help="target size of a published parquet shard (default 500 MB)")
    group.add_argument("--max-error-fraction", type=fraction, default=0.05,
                       help="fail when more than this fraction (0..1) of items hit input errors")
    group.add_argument("--expect-processes", type=positive_int, default=None,
                       help="assert this many processes run (catches a mis-launched accelerate)")
    group.add_argument("--overwrite", action="store_true",
                       help="discard a previous build with a different config in --output")
    group.add_argument("--retry-errors", action="store_true",
                       help="on resume, redo finished parts that recorded input errors")


def add_source_image_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the builders that read source images (`loading_scripts.images`)."""
    from loading_scripts.images import DEFAULT_MAX_IMAGE_PIXELS

    group = parser.add_argument_group("source images")
    group.add_argument("--max-image-pixels", type=positive_int, default=DEFAULT_MAX_IMAGE_PIXELS,
                       metavar="N", help="skip (and count as image_too_large) a source image of more "
                       "pixels, checked from its header before decoding (default %(default)s)")


def run_config_from_args(args: argparse.Namespace):
    from builders.infra.sharding.runner import RunConfig

    return RunConfig(
        output_dir=args.output,
        part_size=args.part_size,
        max_shard_bytes=args.max_shard_bytes,
        max_error_fraction=args.max_error_fraction,
        expect_processes=args.expect_processes,
        overwrite=args.overwrite,
        retry_errors=args.retry_errors,
    )


def run_builder_module(module: ModuleType, args: argparse.Namespace) -> int:
    from builders.infra.models.profiles import apply_profile_defaults
    from builders.infra.sharding.runner import run_build

    result = run_build(module.from_args(apply_profile_defaults(args)), run_config_from_args(args))
    if result is not None:
        counts = {k: v["rows"] for k, v in result.manifest["outputs"].items()}
        logging.getLogger(module.__name__).info("built %s: %s", result.output_dir, counts)
    return 0


def add_builder_parser(parser: argparse.ArgumentParser, module: ModuleType) -> None:
    module.add_arguments(parser)
    add_run_arguments(parser)
    parser.set_defaults(func=lambda args: run_builder_module(module, args))


def register(subparsers: argparse._SubParsersAction) -> None:
    build = subparsers.add_parser("build", help="build a dataset (resumable, shardable)")
    kinds = build.add_subparsers(dest="dataset", metavar="DATASET", required=True)
    for name, module_name in BUILDER_MODULES.items():
        module = importlib.import_module(module_name)
        add_builder_parser(kinds.add_parser(name, help=module.HELP, description=module.HELP), module)


def launch_main(module: ModuleType, argv: list[str] | None = None) -> int:
    """Entry point for `accelerate launch builders/<dataset>/builder.py ...` (same options as the CLI)."""
    from builders.infra.cli import run_handled

    parser = argparse.ArgumentParser(prog=f"accelerate launch {sys.argv[0]}", description=module.HELP)
    add_builder_parser(parser, module)
    return run_handled(parser, argv)
