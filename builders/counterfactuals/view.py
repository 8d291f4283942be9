"""How the `default` rows (image pairs) are viewed: both images, the swapped word highlighted in
both captions, facets by swapped word and rejected candidates, histograms of the scores."""

from __future__ import annotations

from builders.counterfactuals.config import IMAGE_FILTERS
from builders.viewer.row_view import Facet, RowView, Slot, Text

_REJECTED = tuple(f"image_rejected_{name}" for name in IMAGE_FILTERS)

PAIR_VIEW = RowView(
    "counterfactual",
    slots=(Slot("image_0", "image_0"), Slot("image_1", "image_1")),
    # `replaced_position` is the swap's offset in both captions (schema: COLUMN_DOCS).
    texts=(
        Text("caption_0", "caption_0", "highlight", word="replaced_word", position="replaced_position"),
        Text("caption_1", "caption_1", "highlight", word="replacement_word", position="replaced_position"),
    ),
    facets=(
        Facet("replaced word", ("replaced_word",)),
        Facet(
            "skip reason", _REJECTED, "nonzero", labels=tuple(f"candidate rejected: {name}" for name in IMAGE_FILTERS)
        ),
    ),
    histograms=(
        "clip_score_0",
        "clip_score_1",
        "clip_directional",
        "clip_image_similarity",
        "similarity",
        "perplexity",
    ),
    # Per-filter counts: shown as the `skip reason` facet, not as provenance.
    hidden=_REJECTED,
)
