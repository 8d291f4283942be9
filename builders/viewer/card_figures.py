"""The figures a dataset card embeds: an example grid and the key histograms, as PNG files.

Written by the merge into the build folder (`figures/`), so they are published with the shards
and the Hub's card renderer shows them from the card's relative links. The examples are the
first rows of the first output with images (deterministic: the same build gives the same
figures); the histograms cover every row of that output.
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path
from typing import Any, Sequence

import pyarrow.parquet as pq
from PIL import Image

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


def write_card_figures(root: Path, manifest: dict[str, Any]) -> list[dict[str, str]]:
    """Write the card's figures under `root/figures/`; return [{"path", "alt"}] for the card."""
    shutil.rmtree(root / FIGURES_DIR, ignore_errors=True)  # no figure of an earlier merge stays
    out = _pick_output(manifest)
    if out is None:
        return []
    columns = list(out["features"])
    view = view_of(out, columns, _image_columns(out["features"]))
    slots = view.slots_in(columns)
    shards = [root / name for name in out["shards"]]
    first = next(pq.ParquetFile(shards[0]).iter_batches(batch_size=EXAMPLES)).to_pylist()
    examples = []
    for index, row in enumerate(first):
        images = _images(row, slots, index)
        if images:
            examples.append((images, _caption(texts(view, row), facets(view, row))))
    figures = []
    name = f"{out['config']}/{out['split']}"
    if examples:
        path = plots.example_grid(examples, root / FIGURES_DIR / "examples.png")
        figures.append({"path": path.relative_to(root).as_posix(), "alt": f"the first {len(examples)} rows of {name}"})
    for column in [c for c in view.histograms if c in columns]:
        values = [
            v
            for s in shards
            for v in pq.read_table(s, columns=[column]).column(column).to_pylist()
            if v is not None and math.isfinite(v)
        ]
        if values:
            path = plots.histogram(
                values, root / FIGURES_DIR / f"hist_{column}.png", title=f"{column} ({name})", xlabel=column
            )
            figures.append({"path": path.relative_to(root).as_posix(), "alt": f"histogram of {column}"})
    log.info("card figures: %s", [f["path"] for f in figures])
    return figures


def figures_markdown(manifest: dict[str, Any]) -> str:
    """The card's figure block: the example grid, then the histograms in one line."""
    figures = manifest.get("card_figures") or []
    lines = [f"![{f['alt']}]({f['path']})" for f in figures]
    return "\n\n".join(lines[:1] + ([" ".join(lines[1:])] if lines[1:] else []))
