"""`counterfactory local-hub [--port P]`: run the in-memory local Hub in the foreground."""

from __future__ import annotations

import argparse
import threading


def _handler(args: argparse.Namespace) -> int:
    from builders.devtools.local_hub import LocalHub

    hub = LocalHub(port=args.port).start()
    print(
        f"local Hub on {hub.url} (in memory; Ctrl-C stops it and forgets everything)\n"
        f"publish: counterfactory publish OUT --repo-id ORG/NAME --version v1.0.0 --endpoint {hub.url}\n"
        f"other clients (load_dataset, evaluate.load): export HF_ENDPOINT={hub.url} "
        "HF_HUB_DISABLE_XET=1 HF_TOKEN=any",
        flush=True,
    )
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        hub.stop()
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "local-hub",
        help="run a local in-memory Hub-compatible server (for trying publish offline)",
        description="Serve the subset of the Hugging Face Hub API that publishing, load_dataset "
        "and evaluate.load use, on 127.0.0.1. State lives in memory only.",
    )
    p.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (default 8765)")
    p.set_defaults(func=_handler)
