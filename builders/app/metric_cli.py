"""`counterfactory publish-metric MODULE_DIR --repo-id ORG/NAME --version vX.Y.Z`."""

from __future__ import annotations

import argparse
from pathlib import Path

from builders.engine.option_types import positive_number


def _handler(args: argparse.Namespace) -> int:
    from builders.publishing.metric import MetricPublishConfig, publish_metric

    commit = publish_metric(
        MetricPublishConfig(
            args.repo_id, args.version, args.endpoint, args.private, args.timeout, module_dir=args.module_dir
        )
    )
    print(
        f"published {args.repo_id}@{args.version} (commit {commit}); load it with "
        f"evaluate.load({args.repo_id!r}, revision={args.version!r})"
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "publish-metric",
        help="push an evaluate module folder to a Space and tag it",
        description="Upload a metric Space folder (e.g. evaluate_modules/odmap: NAME.py, the helpers it "
        "imports relatively, README.md, requirements.txt) to the Space ORG/NAME, "
        "where NAME.py is the module file, and tag the version so evaluate.load(ORG/NAME, "
        "revision=VERSION) loads exactly it.",
    )
    p.add_argument("module_dir", type=Path, help="folder holding NAME.py (+ README.md)")
    p.add_argument("--repo-id", required=True, help="ORG/NAME of the Space")
    p.add_argument("--version", required=True, help="version tag, e.g. v1.0.0")
    p.add_argument("--endpoint", default=None, help="Hub URL (default: HF_ENDPOINT or huggingface.co)")
    p.add_argument(
        "--timeout", type=positive_number, default=120.0, help="seconds one request may wait for the Hub (default 120)"
    )
    p.add_argument("--private", action="store_true")
    p.set_defaults(func=_handler)
