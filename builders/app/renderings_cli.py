"""`counterfactory renderings --output OUT BUILD BUILD [...] [--overwrite]`: one caption-pair table
rendered by several generators, as one dataset with a config per generator
(`builders.counterfactuals.renderings`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def _handler(args: argparse.Namespace) -> int:
    from builders.counterfactuals.renderings import RenderingsConfig, combine, main_summary

    result = combine(RenderingsConfig(tuple(args.builds), args.output, overwrite=args.overwrite))
    print(main_summary(result))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "renderings",
        help="combine coco-counterfactuals builds of one caption-pair table, one per --generator, into one dataset",
        description="Combine finished `counterfactory build coco-counterfactuals --generator G` builds "
        "of the same caption-pair table (the same caption source and options, or the same "
        "--captions-from table), one per generator, into one build folder with a config per "
        "generator (the first given is the default) and the shared `captions` config: pair ids "
        "are equal across configs, and the card shows each generator's model, license, pairs kept "
        "and filter pass rates. Publish it with `counterfactory publish`; load a generator with "
        'load_dataset(REPO, "flux"). Shards are hard-linked (copied across file systems); the '
        "builds are only read.",
    )
    p.add_argument(
        "builds",
        nargs="+",
        type=Path,
        metavar="BUILD",
        help="the --output folder of a finished coco-counterfactuals build, one per generator (2 or more)",
    )
    p.add_argument("--output", type=Path, required=True, help="folder to write the combined dataset to")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the build in --output (refused when it holds files that are not a build's)",
    )
    p.set_defaults(func=_handler)
