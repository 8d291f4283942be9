"""Row kinds: how a row of each product is shown, detected from its columns.

A kind turns a row into a *record*, the JSON the gallery page renders: thumbnail slots, captions
as text segments (plain, highlighted `hl`, struck through `del`), facet values for the filters,
and provenance as (name, value) pairs. Captions are segments, not HTML, so the page inserts text
only and a caption can never inject markup.

- COCO-Counterfactuals (`image_0`, `image_1`, `caption_0`, `caption_1`): the swapped word is
  highlighted in both captions (at `replaced_position` when it is the character offset of
  `replaced_word`, else the word's first whole-word occurrence).
- Object decorrelation (`image`, `removed_classes`): original | synthetic image with the mask
  outlined on the synthetic one, original | synthetic caption with the removed words struck
  through (a word diff of `original_caption` and `caption`).
- ECCV positives (`image`, `positive_captions`, `positive_sources`): the query image and its
  positive captions grouped by source.
- COCO captions (`image`, `captions`) and any other table with an image column (generic).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

Segments = list[list[str]]

#: Provenance shown first, in this order, when a row has it.
PROVENANCE_ORDER = (
    "p", "guidance_scale", "clip_score_0", "clip_score_1", "clip_directional",
    "clip_image_similarity", "similarity", "perplexity", "image_candidates_tried",
    "image_candidates_passed", "caption_candidates", "caption_candidates_in_window",
    "removal", "anchor_class", "region_fraction", "fill", "caption_method", "seed",
)
KEY_PROVENANCE = frozenset(PROVENANCE_ORDER[:12])
#: Numeric columns whose distributions the stats page and the card plot, when present.
HISTOGRAM_COLUMNS = ("clip_score_0", "clip_score_1", "clip_directional", "clip_image_similarity",
                     "similarity", "perplexity", "region_fraction")
_REJECTED = "image_rejected_"
_LONG_LIST = 12


@dataclass(frozen=True)
class Slot:
    """One thumbnail of a row: the image column, its label, and a mask column to outline on it."""

    column: str
    label: str
    outline: str | None = None


@dataclass(frozen=True)
class RowKind:
    name: str
    #: Columns that must all exist for the kind to apply.
    required: tuple[str, ...]
    slots: Callable[[Sequence[str]], list[Slot]]
    texts: Callable[[dict[str, Any]], list[dict[str, Any]]]
    facets: Callable[[dict[str, Any]], dict[str, list[str]]]
    #: Columns shown by `texts` (left out of the provenance list).
    text_columns: tuple[str, ...] = ()


def _plain(text: Any) -> Segments:
    return [[str(text), ""]] if text not in (None, "") else []


def highlight(text: str, word: str | None, position: int | None) -> Segments:
    """`text` with `word` marked `hl` at `position` (if the word is there) or its first occurrence."""
    if not text or not word:
        return _plain(text)
    start = position if isinstance(position, int) and text[position:position + len(word)] == word else None
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
    matcher = difflib.SequenceMatcher(a=[t.strip().lower() for t in a], b=[t.strip().lower() for t in b],
                                      autojunk=False)
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


# ------------------------------------------------------------------------------- the kinds

def _cf_texts(row: dict[str, Any]) -> list[dict[str, Any]]:
    pos = row.get("replaced_position")
    return [{"label": "caption_0", "segs": highlight(row["caption_0"], row.get("replaced_word"), pos)},
            {"label": "caption_1", "segs": highlight(row["caption_1"], row.get("replacement_word"), pos)}]


def _cf_facets(row: dict[str, Any]) -> dict[str, list[str]]:
    rejected = [name[len(_REJECTED):] for name, v in row.items()
                if name.startswith(_REJECTED) and isinstance(v, (int, float)) and v > 0]
    return {"replaced word": _values(row.get("replaced_word")),
            "skip reason": [f"candidate rejected: {r}" for r in sorted(rejected)]}


def _decor_slots(columns: Sequence[str]) -> list[Slot]:
    slots = [Slot("original_image", "original")] if "original_image" in columns else []
    return slots + [Slot("image", "synthetic", "mask" if "mask" in columns else None)]


def _decor_texts(row: dict[str, Any]) -> list[dict[str, Any]]:
    original, synthetic = row.get("original_caption"), row.get("caption")
    texts = []
    if original and synthetic is not None:
        texts.append({"label": "original caption", "segs": strike_removed(original, synthetic)})
    if synthetic:
        texts.append({"label": "synthetic caption", "segs": _plain(synthetic)})
    return texts


def _decor_facets(row: dict[str, Any]) -> dict[str, list[str]]:
    return {"removed class": _values(row.get("removed_classes")), "removal": _values(row.get("removal"))}


def _eccv_texts(row: dict[str, Any]) -> list[dict[str, Any]]:
    sources = row.get("positive_sources") or []
    ids = row.get("positive_caption_ids") or [None] * len(sources)
    texts = row.get("positive_captions") or [None] * len(sources)
    groups: dict[str, list[str]] = {}
    for text, caption_id, source in zip(texts, ids, sources):
        # Without the COCO captions at build time only the caption id is known.
        groups.setdefault(str(source), []).append(text if text is not None else f"caption {caption_id}")
    return [{"label": f"{source} positives ({len(texts)})", "segs": _plain(" | ".join(texts))}
            for source, texts in sorted(groups.items())]


def _eccv_facets(row: dict[str, Any]) -> dict[str, list[str]]:
    return {"positive source": sorted(set(_values(row.get("positive_sources"))))}


def _captions_texts(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"label": f"caption {k}", "segs": _plain(c)} for k, c in enumerate(row.get("captions") or [])]


def _captions_facets(row: dict[str, Any]) -> dict[str, list[str]]:
    return {"class": sorted({str(o.get("category")) for o in row.get("objects") or [] if isinstance(o, dict)})}


def _generic_texts(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"label": k, "segs": _plain(v)} for k, v in row.items()
            if k in ("caption", "text", "sentence") and isinstance(v, str)]


def _generic_facets(row: dict[str, Any]) -> dict[str, list[str]]:
    return {"skip reason": _values(row.get("reason") or row.get("skip_reason"))}


KINDS = (
    RowKind("counterfactual", ("image_0", "image_1", "caption_0", "caption_1"),
            lambda cols: [Slot("image_0", "image_0"), Slot("image_1", "image_1")],
            _cf_texts, _cf_facets, ("caption_0", "caption_1")),
    RowKind("decorrelation", ("image", "removed_classes"), _decor_slots, _decor_texts,
            _decor_facets, ("caption", "original_caption")),
    RowKind("eccv_positives", ("image", "positive_captions", "positive_sources"),
            lambda cols: [Slot("image", "query image")], _eccv_texts, _eccv_facets,
            ("positive_captions", "positive_sources")),
    RowKind("coco_captions", ("image", "captions"), lambda cols: [Slot("image", "image")],
            _captions_texts, _captions_facets, ("captions",)),
)


def detect_kind(columns: Sequence[str], image_cols: Sequence[str]) -> RowKind:
    for kind in KINDS:
        if all(c in columns for c in kind.required):
            return kind
    return RowKind("generic", (), lambda cols: [Slot(c, c) for c in image_cols], _generic_texts,
                   _generic_facets, ("caption", "text", "sentence"))


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
    names += sorted(n for n in row if n not in names and not n.startswith(_REJECTED))
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


def record(kind: RowKind, row: dict[str, Any], index: int, thumbs: list[dict[str, Any]],
           image_cols: Sequence[str]) -> dict[str, Any]:
    """The page's JSON for one row (`thumbs`: the written thumbnails of `kind.slots`)."""
    texts = kind.texts(row)
    meta = provenance(row, set(image_cols) | set(kind.text_columns))
    return {
        "i": index,
        "id": row_id(row, index),
        "imgs": thumbs,
        "texts": texts,
        "facets": {k: v for k, v in kind.facets(row).items() if v},
        "meta": meta,
        # The generation parameters and scores, shown on the card itself (the rest folds away).
        "key": [m for m in meta if m[0] in KEY_PROVENANCE],
    }


def search_text(rec: dict[str, Any]) -> str:
    """Lower-cased caption text of a record, what the search box matches against."""
    return " ".join("".join(s[0] for s in t["segs"]) for t in rec["texts"]).lower()
