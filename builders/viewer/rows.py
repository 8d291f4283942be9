"""Records: a row as the gallery page shows it, following the table's view (row_view.RowView).

A record is the JSON the gallery page renders: thumbnail slots, captions as text segments (plain,
highlighted `hl`, struck through `del`), facet values for the filters, and provenance as (name,
value) pairs. Captions are segments, not HTML, so the page inserts text only and a caption can
never inject markup.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any, Sequence

from builders.viewer.row_view import Facet, RowView, Text

Segments = list[list[str]]

#: Provenance shown first, in this order, when a row has it.
PROVENANCE_ORDER = (
    "p",
    "guidance_scale",
    "clip_score_0",
    "clip_score_1",
    "clip_directional",
    "clip_image_similarity",
    "similarity",
    "perplexity",
    "image_candidates_tried",
    "image_candidates_passed",
    "caption_candidates",
    "caption_candidates_in_window",
    "removal",
    "anchor_class",
    "region_fraction",
    "fill",
    "caption_method",
    "seed",
)
KEY_PROVENANCE = frozenset(PROVENANCE_ORDER[:12])
_LONG_LIST = 12


def _plain(text: Any) -> Segments:
    return [[str(text), ""]] if text not in (None, "") else []


def highlight(text: str, word: str | None, position: int | None) -> Segments:
    """`text` with `word` marked `hl` at `position` (if the word is there) or its first occurrence."""
    if not text or not word:
        return _plain(text)
    start = position if isinstance(position, int) and text[position : position + len(word)] == word else None
    if start is None:
        match = re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text)
        start = match.start() if match else None
    if start is None:
        return _plain(text)
    end = start + len(word)
    return [s for s in ([text[:start], ""], [text[start:end], "hl"], [text[end:], ""]) if s[0]]


_TOKEN = re.compile(r"\s*(?:[\w'-]+|[^\w\s])")


def strike_removed(original: str, synthetic: str) -> Segments:
    """`original` with the words and punctuation missing from `synthetic` marked `del`."""
    a, b = _TOKEN.findall(original), _TOKEN.findall(synthetic)
    matcher = difflib.SequenceMatcher(
        a=[t.strip().lower() for t in a], b=[t.strip().lower() for t in b], autojunk=False
    )
    segs: Segments = []
    for op, i1, i2, _, _ in matcher.get_opcodes():
        if op == "insert":  # words only the synthetic caption has are not in the original
            continue
        style = "" if op == "equal" else "del"
        text = "".join(a[i1:i2])
        if segs and segs[-1][1] == style:
            segs[-1][0] += text
        else:
            segs.append([text, style])
    return segs


def _values(x: Any) -> list[str]:
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return [str(v) for v in x if v is not None]
    return [str(x)]


# ------------------------------------------------------------------------- a view's texts and facets


def _text(spec: Text, row: dict[str, Any]) -> list[dict[str, Any]]:
    value = row.get(spec.column)
    if spec.style == "highlight":
        word = row.get(spec.word) if spec.word else None
        position = row.get(spec.position) if spec.position else None
        return [{"label": spec.label, "segs": highlight(value, word, position)}]
    if spec.style == "strike":
        against = row.get(spec.against) if spec.against else None
        return [{"label": spec.label, "segs": strike_removed(value, against)}] if value and against is not None else []
    if spec.style == "numbered":
        return [{"label": f"{spec.label} {k}", "segs": _plain(c)} for k, c in enumerate(value or [])]
    if spec.style == "grouped":
        return _grouped(spec, row)
    return [{"label": spec.label, "segs": _plain(value)}] if isinstance(value, str) else []


def _grouped(spec: Text, row: dict[str, Any]) -> list[dict[str, Any]]:
    groups_of = (row.get(spec.group_by) if spec.group_by else None) or []
    ids = (row.get(spec.ids) if spec.ids else None) or [None] * len(groups_of)
    items = row.get(spec.column) or [None] * len(groups_of)
    if not len(items) == len(ids) == len(groups_of):  # a hand-made or hostile dataset's row
        return [
            {
                "label": spec.label,
                "segs": _plain(
                    f"({len(items)} texts, {len(ids)} ids and {len(groups_of)} groups: lists of different "
                    "lengths, not shown)"
                ),
            }
        ]
    groups: dict[str, list[str]] = {}
    for text, item_id, group in zip(items, ids, groups_of, strict=True):
        # Without the texts at build time (ECCV positives without COCO) only the id is known.
        groups.setdefault(str(group), []).append(text if text is not None else f"caption {item_id}")
    return [
        {"label": f"{group} {spec.label} ({len(members)})", "segs": _plain(" | ".join(members))}
        for group, members in sorted(groups.items())
    ]


def texts(view: RowView, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The row's caption blocks, in the view's order."""
    return [block for spec in view.texts for block in _text(spec, row)]


def _facet(spec: Facet, row: dict[str, Any]) -> list[str]:
    if spec.style == "nonzero":
        return sorted(
            label
            for column, label in zip(spec.columns, spec.labels, strict=True)
            if isinstance(row.get(column), (int, float)) and row[column] > 0
        )
    if spec.style == "distinct" and spec.field:
        return sorted({str(o.get(spec.field)) for o in row.get(spec.columns[0]) or [] if isinstance(o, dict)})
    value = row.get(spec.columns[0])
    for column in spec.columns[1:]:
        value = value or row.get(column)
    return sorted(set(_values(value))) if spec.style == "distinct" else _values(value)


def facets(view: RowView, row: dict[str, Any]) -> dict[str, list[str]]:
    """Facet name -> the row's values, in the view's order."""
    return {spec.name: _facet(spec, row) for spec in view.facets}


def _format(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None if value is None else str(value).lower()
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, (int, str)):
        return str(value)[:120]
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
        shown = ", ".join(_format(v) or "" for v in value[:_LONG_LIST])
        return shown + (f", … ({len(value)})" if len(value) > _LONG_LIST else "")
    return None  # structs (boxes) and nested lists stay in the parquet


def provenance(row: dict[str, Any], skip: set[str]) -> list[list[str]]:
    names = [n for n in PROVENANCE_ORDER if n in row]
    names += sorted(n for n in row if n not in names)
    out = []
    for name in names:
        if name in skip:
            continue
        shown = _format(row[name])
        if shown is not None:
            out.append([name, shown])
    return out


def row_id(row: dict[str, Any], index: int) -> str:
    for name in ("id", "row_id", "query_id", "image_id", "caption_id"):
        if row.get(name) is not None:
            return str(row[name])
    return str(index)


def record(
    view: RowView, row: dict[str, Any], index: int, thumbs: list[dict[str, Any]], image_cols: Sequence[str]
) -> dict[str, Any]:
    """The page's JSON for one row (`thumbs`: the written thumbnails of the view's slots)."""
    meta = provenance(row, set(image_cols) | view.text_columns | set(view.hidden))
    return {
        "i": index,
        "id": row_id(row, index),
        "imgs": thumbs,
        "texts": texts(view, row),
        "facets": {k: v for k, v in facets(view, row).items() if v},
        "meta": meta,
        # The generation parameters and scores, shown on the card itself (the rest folds away).
        "key": [m for m in meta if m[0] in KEY_PROVENANCE],
    }


def search_text(rec: dict[str, Any]) -> str:
    """Lower-cased caption text of a record, what the search box matches against."""
    return " ".join("".join(s[0] for s in t["segs"]) for t in rec["texts"]).lower()
