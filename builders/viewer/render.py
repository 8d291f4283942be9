"""Write the static gallery: thumbnails, page scripts, search index, index.html and stats.html.

    OUT/
      index.html, stats.html, style.css, gallery.js
      pages/page-NNNNN.js     `page_size` row records each (`window.galleryPage(n, [...])`)
      index/part-NNNNN.js     [row, caption text, facets] of `index_part_rows` rows each
      thumbs/KKKK/RRRRRRR_S.jpg   one thumbnail per image of a row (thumbnails.py)
      stats/*.png             bar charts and histograms (plots.py)
      gallery.json            marks OUT as a gallery; when complete: rows, pages, first-page bytes

An image that cannot be shown (a cell with a path but no bytes, which is never opened; truncated
or undecodable bytes; too many pixels) is a missing thumbnail with its reason, counted on the
stats page and in gallery.json. A write that fails (disk full, no permission) is one line naming
the path (`OutputError`).

Page data are script files, not JSON fetched at run time, because browsers refuse `fetch` on
file:// URLs and the gallery must open from disk. index.html carries only the first page's script
and its thumbnails (lazy-loaded), so its weight does not grow with the build; the search index is
loaded when a filter or search is first used.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from builders.engine.errors import OutputError, UserFacingError
from builders.viewer import plots
from builders.viewer.row_view import Slot, view_of
from builders.viewer.rows import record, search_text
from builders.viewer.source import GallerySource
from builders.viewer.stats import EXAMPLE_ROWS, GalleryStats, skip_counts
from loading_scripts.image_gps import gps_check
from builders.viewer.thumbnails import ThumbnailProblem, ThumbnailConfig, decode_image, thumbnail_path, write_thumbnail

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).parent / "templates"
MARKER = "gallery.json"
_GENERATED = ("pages", "index", "thumbs", "stats")
#: Values listed in a filter menu (most frequent first); the search box reaches the rest.
MAX_FILTER_VALUES = 300


@dataclass(frozen=True)
class GalleryConfig:
    """Example: `GalleryConfig(output=Path("gallery"), page_size=24)`."""

    #: Folder to write (created; an earlier gallery there is replaced, any other content refused).
    output: Path
    #: Rows per page.
    page_size: int = 24
    #: Rows per search-index file.
    index_part_rows: int = 2000
    thumbnails: ThumbnailConfig = field(default_factory=ThumbnailConfig)


@dataclass(frozen=True)
class GalleryResult:
    index_html: Path
    rows: int
    pages: int
    kind: str
    #: Bytes a browser loads for the first page: HTML, CSS, JS, page data and every thumbnail.
    first_page_bytes: int
    #: Images shown as missing, per reason (thumbnails.ThumbnailProblem), most frequent first.
    images_not_shown: dict[str, int] = field(default_factory=dict)
    #: Images whose metadata holds a GPS position, or that could not be read fully (treated as
    #: holding one: `loading_scripts/image_gps.py`), flagged on their thumbnail and the stats page.
    images_with_gps: int = 0
    #: Of those, the images that could not be read fully.
    images_gps_unknown: int = 0


def _prepare(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} is a file; give a folder for the gallery (--output)")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists():
        raise OutputError(
            f"{out} is not empty and holds no gallery; give an empty or new folder "
            "(--output), an earlier gallery there is replaced"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in _GENERATED:
            shutil.rmtree(out / name, ignore_errors=True)
        # Marks the folder as a gallery at once, so a rerun after a crash may replace it.
        (out / MARKER).write_text(json.dumps({"complete": False}))
    except OSError as err:
        raise OutputError(f"{out}: cannot write the gallery ({err.strerror or err})") from None


def _script(path: Path, call: str, n: int, data: Any) -> int:
    text = f"{call}({n}, {json.dumps(data, ensure_ascii=False, separators=(',', ':'))});\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path.stat().st_size


def _templates():
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )


class _Writer:
    """One pass over the rows: thumbnails, page files, index parts, stats."""

    def __init__(self, source: GallerySource, cfg: GalleryConfig) -> None:
        self.cfg, self.out = cfg, cfg.output
        self.image_cols = source.image_columns
        columns = list(source.features)
        output = (source.manifest or {}).get("outputs", {}).get(f"{source.config}/{source.split}")
        self.view = view_of(output, columns, self.image_cols)
        self.slots = self.view.slots_in(columns)
        self.stats = GalleryStats(self.view.histograms)
        self.page: list[dict[str, Any]] = []
        self.index: list[list[Any]] = []
        self.pages = self.index_parts = 0
        self.first_page_bytes = 0

    def add(self, index: int, row: dict[str, Any]) -> None:
        # A null cell is an optional image this row lacks: nothing to show, nothing wrong.
        thumbs = [
            self.thumbnail(index, k, slot, row)
            for k, slot in enumerate(self.slots)
            if row.get(slot.column) is not None
        ]
        rec = record(self.view, row, index, thumbs, self.image_cols)
        self.stats.add(row, rec["facets"])
        self.page.append(rec)
        self.index.append([index, search_text(rec), rec["facets"]])
        if len(self.page) == self.cfg.page_size:
            self.flush_page()
        if len(self.index) == self.cfg.index_part_rows:
            self.flush_index()

    def thumbnail(self, index: int, k: int, slot: Slot, row: dict[str, Any]) -> dict[str, Any]:
        """The record of one image of a row: its written thumbnail, or why it is missing; and
        whether it carries a GPS position."""
        max_pixels = self.cfg.thumbnails.max_pixels
        gps = self.gps_flag(index, slot.column, row[slot.column])
        try:
            image = decode_image(row[slot.column], max_pixels)
        except ThumbnailProblem as problem:
            self.not_shown(index, slot.column, problem)
            return {"label": slot.label, "missing": problem.reason, **gps}
        mask = None
        if slot.outline and row.get(slot.outline) is not None:
            try:
                mask = decode_image(row[slot.outline], max_pixels)
            except ThumbnailProblem as problem:  # the image is shown, without the outline
                self.not_shown(index, slot.outline, problem)
        rel = thumbnail_path(index, k)
        size = write_thumbnail(image, self.out / rel, self.cfg.thumbnails, mask)
        if self.pages == 0:
            self.first_page_bytes += (self.out / rel).stat().st_size
        return {"src": rel, "label": slot.label, **size, **gps}

    def gps_flag(self, index: int, column: str, cell: Any) -> dict[str, Any]:
        """{"gps": True} for an image whose metadata holds a GPS position, {"gps": "unknown"} for
        one that could not be read fully (treated as holding one), else {}. Real images are
        stored as their files' bytes: a photo's metadata may publish where it was taken, shown
        or not."""
        data = cell.get("bytes") if isinstance(cell, dict) else None
        if not isinstance(data, bytes) or not data:
            return {}
        gps = gps_check(data)
        if not gps.flagged:
            return {}
        self.stats.image_with_gps(index, unknown=not gps.found)
        if not gps.found:
            log.debug("row %d (%s): GPS unknown, treated as present: %s", index, column, gps.unread[0])
        return {"gps": True if gps.found else "unknown"}

    def not_shown(self, index: int, column: str, problem: ThumbnailProblem) -> None:
        self.stats.image_not_shown(index, problem.reason)
        log.debug("row %d (%s): image not shown, %s", index, column, problem)

    def flush_page(self) -> None:
        size = _script(self.out / f"pages/page-{self.pages:05d}.js", "window.galleryPage", self.pages, self.page)
        if self.pages == 0:
            self.first_page_bytes += size
        self.pages += 1
        self.page = []

    def flush_index(self) -> None:
        _script(
            self.out / f"index/part-{self.index_parts:05d}.js", "window.galleryIndex", self.index_parts, self.index
        )
        self.index_parts += 1
        self.index = []

    def finish(self) -> None:
        if self.page or self.pages == 0:  # an empty split still gets its (empty) first page
            self.flush_page()
        if self.index:
            self.flush_index()


def _stats_page(w: _Writer, source: GallerySource, env, common: dict[str, Any]) -> None:
    out = w.out
    skips = skip_counts(source.manifest, source.config)
    skip_plot = None
    if skips:
        skip_plot = plots.bar_chart(
            skips, out / "stats/skip_reasons.png", title="skipped items by reason", xlabel="items"
        ).relative_to(out)
    facet_stats = []
    for k, (name, counts) in enumerate(sorted(w.stats.facets.items())):
        path = plots.bar_chart(counts, out / f"stats/facet_{k}.png", title=f"rows per {name}")
        facet_stats.append(
            {
                "name": name,
                "plot": path.relative_to(out).as_posix(),
                "counts": sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])),
            }
        )
    histograms = []
    for column, values in sorted(w.stats.numbers.items()):
        path = plots.histogram(values, out / f"stats/hist_{column}.png", title=column, xlabel=column)
        histograms.append(
            {
                "column": column,
                "plot": path.relative_to(out).as_posix(),
                "n": len(values),
                "min": f"{min(values):.4g}",
                "mean": f"{sum(values) / len(values):.4g}",
                "max": f"{max(values):.4g}",
            }
        )
    not_shown = [
        (reason, n, ", ".join(map(str, w.stats.rows_not_shown[reason])))
        for reason, n in w.stats.not_shown_counts().items()
    ]
    html = env.get_template("stats.html").render(
        **common,
        skips=list(skips.items()),
        skipped_total=sum(skips.values()),
        skip_plot=skip_plot.as_posix() if skip_plot else None,
        has_manifest=source.manifest is not None,
        facet_stats=facet_stats,
        histograms=histograms,
        not_shown=not_shown,
        example_rows=EXAMPLE_ROWS,
        not_shown_total=sum(w.stats.images_not_shown.values()),
        gps_images=w.stats.images_with_gps,
        gps_unknown=w.stats.images_gps_unknown,
        gps_rows=", ".join(map(str, w.stats.rows_with_gps)),
    )
    (out / "stats.html").write_text(html, encoding="utf-8")


def write_gallery(source: GallerySource, cfg: GalleryConfig) -> GalleryResult:
    """Write the gallery of `source` into `cfg.output`; return where and how big."""
    out = cfg.output
    _prepare(out)
    try:
        result = _write(source, cfg)
    except OSError as err:
        # Reading errors were turned into UserFacingError by `_rows`: this one is a write.
        raise OutputError(
            f"{err.filename or out}: cannot write the gallery "
            f"({err.strerror or err}); free disk space or fix the permissions, or "
            "give another --output, then re-run"
        ) from None
    if result.images_with_gps:
        log.warning(
            "%s: %d images carry a GPS position in their metadata%s; see %s",
            source.title,
            result.images_with_gps,
            _unknown(result),
            out / "stats.html",
        )
    if result.images_not_shown:
        log.warning(
            "%s: %d images not shown (%s); see %s",
            source.title,
            sum(result.images_not_shown.values()),
            _counts(result.images_not_shown),
            out / "stats.html",
        )
    log.info(
        "gallery of %s (%s/%s): %d rows, %d pages, first page %.0f kB -> %s",
        source.title,
        source.config,
        source.split,
        result.rows,
        result.pages,
        result.first_page_bytes / 1000,
        result.index_html,
    )
    return result


def _rows(source: GallerySource) -> Iterator[dict[str, Any]]:
    """The source's rows; a failing read (network, file) is one line naming the source."""
    rows = source.rows()
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except OSError as err:
            raise UserFacingError(
                f"{source.title}: cannot read the rows of {source.config}/"
                f"{source.split} ({type(err).__name__}: {err}); check the "
                "folder or the network and re-run"
            ) from None
        yield row


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in counts.items())


def not_shown_summary(result: GalleryResult) -> str:
    """ "; 2 images not shown (path_only 2; see stats.html)" or "" when every image is shown,
    then "; 3 images carry a GPS position (see stats.html)" when any does."""
    summary = ""
    if result.images_not_shown:
        summary += (
            f"; {sum(result.images_not_shown.values())} images not shown "
            f"({_counts(result.images_not_shown)}; see stats.html)"
        )
    if result.images_with_gps:
        summary += f"; {result.images_with_gps} images carry a GPS position{_unknown(result)} (see stats.html)"
    return summary


def _unknown(result: GalleryResult) -> str:
    """ " (2 of them GPS: unknown, could not be read fully: treated as present)" or ""."""
    if not result.images_gps_unknown:
        return ""
    return f" ({result.images_gps_unknown} of them GPS: unknown, could not be read fully: treated as present)"


def _write(source: GallerySource, cfg: GalleryConfig) -> GalleryResult:
    out = cfg.output
    w = _Writer(source, cfg)
    for index, row in enumerate(_rows(source)):
        w.add(index, row)
    w.finish()
    env = _templates()
    common = {
        "title": source.title,
        "config": source.config,
        "split": source.split,
        "rows": w.stats.rows,
        "kind": w.view.name,
    }
    facets = [
        {"name": name, "options": sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_FILTER_VALUES]}
        for name, c in sorted(w.stats.facets.items())
    ]
    meta = {
        "rows": w.stats.rows,
        "pageSize": cfg.page_size,
        "pages": w.pages,
        "indexParts": w.index_parts,
        "kind": w.view.name,
    }
    # `</` inside inline JSON would end the <script> element early.
    meta_json = json.dumps(meta).replace("</", "<\\/")
    html = env.get_template("index.html").render(**common, facets=facets, meta_json=meta_json)
    (out / "index.html").write_text(html, encoding="utf-8")
    for name in ("style.css", "gallery.js"):
        shutil.copyfile(TEMPLATES / name, out / name)
    _stats_page(w, source, env, common)
    first = w.first_page_bytes + sum((out / n).stat().st_size for n in ("index.html", "style.css", "gallery.js"))
    result = GalleryResult(
        index_html=out / "index.html",
        rows=w.stats.rows,
        pages=w.pages,
        kind=w.view.name,
        first_page_bytes=first,
        images_not_shown=w.stats.not_shown_counts(),
        images_with_gps=w.stats.images_with_gps,
        images_gps_unknown=w.stats.images_gps_unknown,
    )
    _write_marker(out, source, result)
    return result


def _write_marker(out: Path, source: GallerySource, result: GalleryResult) -> None:
    """gallery.json: marks `out` as a complete gallery, with its counts."""
    marker = {
        "complete": True,
        "source": source.title,
        "config": source.config,
        "split": source.split,
        "rows": result.rows,
        "pages": result.pages,
        "kind": result.kind,
        "first_page_bytes": result.first_page_bytes,
        "images_not_shown": result.images_not_shown,
        "images_with_gps": result.images_with_gps,
        "images_gps_unknown": result.images_gps_unknown,
    }
    (out / MARKER).write_text(json.dumps(marker, indent=1))


def write_gallery_index(root: Path, galleries: dict[str, Path]) -> Path:
    """root/index.html linking several galleries (name -> gallery folder inside `root`)."""
    entries = []
    for name, folder in galleries.items():
        summary = json.loads((folder / MARKER).read_text())
        rel = folder.relative_to(root).as_posix()
        entries.append(
            {
                "name": name,
                "href": f"{rel}/index.html",
                "stats": f"{rel}/stats.html",
                "config": summary["config"],
                "split": summary["split"],
                "rows": summary["rows"],
            }
        )
    css = next(iter(galleries.values())).relative_to(root).as_posix() + "/style.css" if galleries else ""
    html = _templates().get_template("galleries.html").render(galleries=entries, css=css)
    (root / "index.html").write_text(html, encoding="utf-8")
    return root / "index.html"
