"""`counterfactory show BUILD_DIR_OR_REPO --output DIR [--revision R] [--config C] [--split S] [--serve PORT]`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from builders.engine.option_types import positive_int

log = logging.getLogger(__name__)


def _serve(folder: Path, port: int) -> None:
    """Serve `folder` on 127.0.0.1 until interrupted (the gallery also opens from disk)."""
    import functools
    import http.server

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"serving the gallery on http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


def _handler(args: argparse.Namespace) -> int:
    from builders.viewer.render import GalleryConfig, not_shown_summary, write_gallery
    from builders.viewer.source import GallerySourceConfig, open_source

    source = open_source(
        GallerySourceConfig(target=args.target, revision=args.revision, config=args.config, split=args.split)
    )
    result = write_gallery(source, GalleryConfig(output=args.output, page_size=args.page_size))
    print(
        f"wrote the gallery of {source.title} ({source.config}/{source.split}, {result.rows} rows, "
        f"{result.pages} pages{not_shown_summary(result)}): open {result.index_html.resolve()}"
    )
    if args.serve is not None:
        _serve(args.output, args.serve)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "show",
        help="write a browsable static gallery (HTML) of a build or a published dataset",
        description="Write a static HTML gallery of one config/split of a build folder or a Hub "
        "dataset at a revision: rows with their images side by side (thumbnails), captions with "
        "the swapped word highlighted or the removed words struck through, provenance, filters, "
        "caption search and a stats page. Open OUTPUT/index.html in a browser; no server needed.",
    )
    p.add_argument("target", help="a build folder (written by `counterfactory build`) or a Hub dataset id ORG/NAME")
    p.add_argument("--output", type=Path, required=True, help="folder to write the gallery to")
    p.add_argument(
        "--revision",
        default=None,
        help="Hub revision (tag such as v1.0.0, branch or commit) of ORG/NAME; default: the main branch",
    )
    p.add_argument(
        "--config", default=None, help="config to show (default: `default`, else the first config with images)"
    )
    p.add_argument("--split", default=None, help="split to show (default: the config's first)")
    p.add_argument("--page-size", type=positive_int, default=24, help="rows per page (default 24)")
    p.add_argument(
        "--serve",
        type=int,
        default=None,
        metavar="PORT",
        help="afterwards serve the gallery on http://127.0.0.1:PORT (0: any free port)",
    )
    p.set_defaults(func=_handler)
