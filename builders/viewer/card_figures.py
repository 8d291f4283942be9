"""The figures a dataset card embeds: an example grid and the key histograms, as PNG files.

Written by the merge into the build folder (`figures/`), so they are published with the shards
and the Hub's card renderer shows them from the card's relative links. The examples are the
first rows of the first output with images (deterministic: the same build gives the same
figures); the histograms cover every row of that output.
"""

from __future__ import annotations

import functools
import io
import logging
import math
from typing import Any, BinaryIO, Callable, Sequence

import pyarrow.parquet as pq
from PIL import Image

from builders.engine.no_follow import RootDir
from builders.viewer import plots
from builders.viewer.row_view import Slot, view_of
from builders.viewer.rows import facets, texts
from builders.viewer.thumbnails import ThumbnailProblem, decode_image

log = logging.getLogger(__name__)

FIGURES_DIR = "figures"
EXAMPLES = 4


def _image_columns(features: dict[str, Any]) -> list[str]:
    return [name for name, f in features.items() if isinstance(f, dict) and f.get("_type") == "Image"]


def _pick_output(manifest: dict[str, Any]) -> dict[str, Any] | None:
    with_images = [o for o in manifest["outputs"].values() if o["rows"] and _image_columns(o["features"])]
    defaults = [o for o in with_images if o["config"] == "default"]
    return (defaults or with_images or [None])[0]


def _caption(texts: list[dict[str, Any]], facets: dict[str, list[str]]) -> str:
    """The row's captions (a struck-through original is left out: the synthetic one follows)."""
    plain = [t for t in texts if not any(seg[1] == "del" for seg in t["segs"])]
    caption = "  →  ".join("".join(seg[0] for seg in t["segs"]).strip() for t in plain[:2])
    removed = facets.get("removed class")
    return caption + (f"  (removed: {', '.join(removed)})" if removed else "")


def _images(row: dict[str, Any], slots: Sequence[Slot], index: int) -> list[Image.Image]:
    """The row's images that can be drawn, from their bytes (a path is never opened)."""
    images = []
    for slot in slots:
        if row.get(slot.column) is None:
            continue
        try:
            images.append(decode_image(row[slot.column]))
        except ThumbnailProblem as problem:
            log.warning("card figures: row %d (%s) left out of the examples: %s", index, slot.column, problem)
    return images


def write_card_figures(out: RootDir, manifest: dict[str, Any]) -> list[dict[str, str]]:
    """Write the card's figures under the build root `out`'s `figures/`, relative to its descriptor
    (a linked `figures/` is refused, never emptied or written through); return [{"path", "alt"}]
    for the card."""
    if out.lstat(FIGURES_DIR) is not None:
        out.remove_tree(FIGURES_DIR)  # no figure of an earlier merge stays
    chosen = _pick_output(manifest)
    if chosen is None:
        return []
    columns = list(chosen["features"])
    view = view_of(chosen, columns, _image_columns(chosen["features"]))
    slots = view.slots_in(columns)
    with out.open(chosen["shards"][0], "rb") as fh:
        first = next(pq.ParquetFile(fh).iter_batches(batch_size=EXAMPLES)).to_pylist()
    examples = []
    for index, row in enumerate(first):
        images = _images(row, slots, index)
        if images:
            examples.append((images, _caption(texts(view, row), facets(view, row))))
    figures = []
    name = f"{chosen['config']}/{chosen['split']}"
    if examples:
        rel = _save(out, "examples.png", lambda png: plots.example_grid(examples, png))
        figures.append({"path": rel, "alt": f"the first {len(examples)} rows of {name}"})
    for column in [c for c in view.histograms if c in columns]:
        values = [v for v in _column(out, chosen["shards"], column) if v is not None and math.isfinite(v)]
        if values:
            title = f"{column} ({name})"
            draw = functools.partial(plots.histogram, values, title=title, xlabel=column)
            figures.append({"path": _save(out, f"hist_{column}.png", draw), "alt": f"histogram of {column}"})
    log.info("card figures: %s", [f["path"] for f in figures])
    return figures


def _save(out: RootDir, name: str, draw: Callable[[BinaryIO], object]) -> str:
    """Draw a figure into memory, then write it as `figures/<name>` (its path in the build)."""
    png = io.BytesIO()
    draw(png)
    rel = f"{FIGURES_DIR}/{name}"
    out.write_atomic(rel, png.getbuffer())
    return rel


def _column(out: RootDir, shards: Sequence[str], column: str) -> list[Any]:
    """One column of every shard, each read through the build root's descriptor."""
    values: list[Any] = []
    for shard in shards:
        with out.open(shard, "rb") as fh:
            values += pq.read_table(fh, columns=[column]).column(column).to_pylist()
    return values


def figures_markdown(manifest: dict[str, Any]) -> str:
    """The card's figure block: the example grid, then the histograms in one line."""
    figures = manifest.get("card_figures") or []
    lines = [f"![{f['alt']}]({f['path']})" for f in figures]
    return "\n\n".join(lines[:1] + ([" ".join(lines[1:])] if lines[1:] else []))
