"""`counterfactory publish OUTPUT_DIR --repo-id ORG/NAME --version vX.Y.Z [--endpoint URL]`."""

from __future__ import annotations

import argparse
from pathlib import Path

from builders.engine.option_types import positive_number


def _handler(args: argparse.Namespace) -> int:
    from builders.publishing.publish import PublishConfig, publish

    result = publish(
        PublishConfig(
            output_dir=args.output_dir,
            repo_id=args.repo_id,
            version=args.version,
            endpoint=args.endpoint,
            private=args.private,
            timeout_s=args.timeout,
            retries=args.retries,
        )
    )
    if result.already_published:
        print(
            f"{result.repo_id}@{result.version} already holds exactly this build "
            f"(commit {result.commit}); nothing uploaded"
        )
    else:
        print(
            f"published {result.repo_id}@{result.version} (commit {result.commit}; "
            f"{result.uploaded_files} files uploaded, {result.unchanged_files} unchanged)"
        )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "publish",
        help="push a build to the Hub as a tagged version",
        description="Upload a build folder (parquet shards, card, manifest) to a dataset repo and "
        "tag it. Re-running after an interruption completes the same version (a rerun after the "
        "tag exits 0 when the tag holds exactly this build); an existing tag is never moved. The "
        "token comes from HF_TOKEN or `hf auth login`.",
    )
    p.add_argument("output_dir", type=Path, help="a finished build folder")
    p.add_argument("--repo-id", required=True, help="ORG/NAME of the dataset repo")
    p.add_argument("--version", required=True, help="version tag, e.g. v1.0.0")
    p.add_argument(
        "--endpoint",
        default=None,
        help="Hub URL, e.g. http://127.0.0.1:8765 for `counterfactory local-hub` "
        "(default: HF_ENDPOINT or huggingface.co); nothing else needs setting",
    )
    p.add_argument(
        "--timeout",
        type=positive_number,
        default=120.0,
        help="seconds one request may wait for the Hub before it is retried (default 120)",
    )
    p.add_argument(
        "--retries", type=int, default=5, help="attempts per Hub call on 429/5xx or a lost connection (default 5)"
    )
    p.add_argument("--private", action="store_true", help="create the repo as private")
    p.set_defaults(func=_handler)
