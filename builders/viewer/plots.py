"""Bar charts, histograms and example grids as PNG files (matplotlib's Agg canvas, no pyplot).

A bare `Figure` with the Agg canvas leaves pyplot's global backend alone, and PNGs are written
without the software/version metadata so the same numbers give the same bytes. Every figure is
drawn under `plain_text`: captions, class names and titles come from data and are drawn as
written, never parsed as mathtext.
"""

from __future__ import annotations

import functools
import math
import textwrap
from pathlib import Path
from typing import BinaryIO, Callable, Mapping, ParamSpec, Sequence, TypeVar

import numpy as np
from PIL import Image

#: Bars beyond this many are summed into "other" (a chart of 5,000 words reads as nothing).
MAX_BARS = 30
_PNG = {"Software": None}
_P = ParamSpec("_P")
_R = TypeVar("_R")


def plain_text(draw: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run `draw` with matplotlib's mathtext off, so text from data is plain text.

    With mathtext on, a caption or a name with two `$` ("$5 and $10", a code snippet) is parsed
    as TeX math: drawn wrong, or raising on an unknown command. Titles and labels read the setting
    when they are created and tick labels when the figure is drawn, so the whole figure, savefig
    included, is made inside `draw`.
    """

    @functools.wraps(draw)
    def plain(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)

    return plain


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path | BinaryIO, dpi: int = 100) -> Path | BinaryIO:
    """Save as PNG to `path`, or into a binary file object (the caller writes it where it must)."""
    if isinstance(path, Path):
        path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi, metadata=_PNG, format="png")
    return path


def top_counts(counts: Mapping[str, int], limit: int = MAX_BARS) -> list[tuple[str, int]]:
    """Largest first (ties by name); the rest summed as "other (N values)"."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(ranked) <= limit:
        return ranked
    rest = ranked[limit - 1 :]
    return ranked[: limit - 1] + [(f"other ({len(rest)} values)", sum(v for _, v in rest))]


@plain_text
def bar_chart(counts: Mapping[str, int], path: Path, *, title: str, xlabel: str = "rows") -> Path:
    """Horizontal bars, largest on top."""
    bars = top_counts(counts)
    fig = _figure(6.0, 0.8 + 0.28 * max(1, len(bars)))
    ax = fig.add_subplot()
    labels = [textwrap.shorten(k, 40) for k, _ in bars][::-1]
    ax.barh(labels, [v for _, v in bars][::-1], color="tab:blue")
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    return _save(fig, path)


@plain_text
def histogram(
    values: Sequence[float], path: Path | BinaryIO, *, title: str, xlabel: str, bins: int = 30
) -> Path | BinaryIO:
    fig = _figure(4.5, 3.0)
    ax = fig.add_subplot()
    arr = np.asarray(values, dtype=float)
    ax.hist(arr, bins=bins, color="tab:orange")
    ax.axvline(
        float(arr.mean()), color="black", linestyle="--", linewidth=1, label=f"mean {arr.mean():.3g} (n={arr.size})"
    )
    ax.set_xlabel(xlabel)
    ax.set_ylabel("rows")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(fig, path)


@plain_text
def example_grid(
    rows: Sequence[tuple[Sequence[Image.Image], str]],
    path: Path | BinaryIO,
    *,
    cell: float = 1.8,
    images_per_line: int = 4,
) -> Path | BinaryIO:
    """Examples side by side (their images next to each other), each captioned above."""
    n_img = max(len(images) for images, _ in rows)
    per_line = max(1, images_per_line // n_img)
    lines = math.ceil(len(rows) / per_line)
    fig = _figure(cell * n_img * per_line + 0.2, (cell + 0.7) * lines)
    axes = fig.subplots(lines, n_img * per_line, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for k, (images, caption) in enumerate(rows):
        line, first = divmod(k, per_line)
        cells = axes[line][first * n_img : (first + 1) * n_img]
        for ax, image in zip(cells, images, strict=False):
            ax.imshow(np.asarray(image.convert("RGB")))
        cells[0].set_title(textwrap.fill(caption, 24 * n_img), fontsize=7, loc="left")
    return _save(fig, path, dpi=90)
