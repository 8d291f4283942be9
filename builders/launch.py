"""How any builder runs from the command line: the options every builder shares (`BuildRunConfig`,
source images), the build-then-log handler, and `launch_main`, the `accelerate launch
builders/<dataset>/builder.py ...` entry point. `counterfactory build X ...` (the table in
`builders.app.registry`) and `accelerate launch` run this same code.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from builders.engine.option_types import fraction, non_negative_int, positive_int
from builders.models.pickled_weights import FLAG as PICKLE_FLAG, FLAG_HELP as PICKLE_FLAG_HELP


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `BuildRunConfig` (how the build runs, as opposed to what it builds)."""
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
    group.add_argument(PICKLE_FLAG, action="store_true", help=PICKLE_FLAG_HELP)
    array = parser.add_argument_group(
        "job array", "build on a preemptible cluster without rendezvous: each worker builds its "
        "parts (k % N == I) and exits; a final --merge-only run writes the dataset. Inside a "
        "SLURM job array the worker comes from SLURM_ARRAY_TASK_ID/_MIN/_COUNT")
    array.add_argument("--worker-index", type=non_negative_int, default=None, metavar="I",
                       help="this worker's index, 0..N-1 (with --num-workers)")
    array.add_argument("--num-workers", type=positive_int, default=None, metavar="N",
                       help="how many array workers share the build")
    array.add_argument("--merge-only", action="store_true",
                       help="merge the parts the workers built; fails naming any missing part")


def add_source_image_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the builders that read source images (`loading_scripts.images`)."""
    from loading_scripts.images import DEFAULT_MAX_IMAGE_PIXELS

    group = parser.add_argument_group("source images")
    group.add_argument("--max-image-pixels", type=positive_int, default=DEFAULT_MAX_IMAGE_PIXELS,
                       metavar="N", help="skip (and count as image_too_large) a source image of more "
                       "pixels, checked from its header before decoding (default %(default)s)")


def run_config_from_args(args: argparse.Namespace):
    from builders.engine.distributed import array_worker
    from builders.engine.sharding.runner import BuildRunConfig

    if args.merge_only:
        # A merge needs only the worker count, to name the worker of each missing part.
        slurm = None if args.num_workers else array_worker(None, None)
        worker_index, num_workers = None, args.num_workers or (slurm[1] if slurm else None)
    else:
        worker_index, num_workers = array_worker(args.worker_index, args.num_workers) or (None, None)
    return BuildRunConfig(
        output_dir=args.output,
        part_size=args.part_size,
        max_shard_bytes=args.max_shard_bytes,
        max_error_fraction=args.max_error_fraction,
        expect_processes=args.expect_processes,
        overwrite=args.overwrite,
        retry_errors=args.retry_errors,
        worker_index=worker_index,
        num_workers=num_workers,
        merge_only=args.merge_only,
    )


#: `args -> ShardedBuilder`: a dataset's `builder.from_args` (its options.py declares the flags and
#: never imports the builder, so neither imports the other).
BuildFromArgs = Callable[[argparse.Namespace], Any]


def run_builder_module(module: ModuleType, args: argparse.Namespace,
                       build: BuildFromArgs | None = None) -> int:
    from builders.models.pickled_weights import trusting_pickled_weights
    from builders.models.profiles import apply_profile_defaults
    from builders.engine.sharding.runner import run_build
    from builders.publishing.card import write_card

    with trusting_pickled_weights(args.trust_pickled_weights):
        builder = (build or module.from_args)(apply_profile_defaults(args))
        result = run_build(builder, run_config_from_args(args), finish=write_card)
    if result is not None:
        counts = {k: v["rows"] for k, v in result.manifest["outputs"].items()}
        logging.getLogger(module.__name__).info("built %s: %s", result.output_dir, counts)
    return 0


def add_builder_parser(parser: argparse.ArgumentParser, module: ModuleType,
                       build: BuildFromArgs | None = None) -> None:
    """`module`'s flags and the run's; `build` (default `module.from_args`) makes the builder."""
    module.add_arguments(parser)
    add_run_arguments(parser)
    parser.set_defaults(func=lambda args: run_builder_module(module, args, build))


def launch_main(module: ModuleType, build: BuildFromArgs | None = None,
                argv: list[str] | None = None) -> int:
    """Entry point for `accelerate launch builders/<dataset>/builder.py ...` (same options as the CLI)."""
    from builders.engine.errors import run_handled

    parser = argparse.ArgumentParser(prog=f"accelerate launch {sys.argv[0]}", description=module.HELP)
    add_builder_parser(parser, module, build)
    return run_handled(parser, argv)
