"""How the D' rows (`default`) and the ODmAP queries are viewed: original | synthetic image with
the mask outlined, the original caption with the removed words struck through, facets by removed
class and removal, the region fraction's histogram."""

from __future__ import annotations

from builders.viewer.row_view import Facet, RowView, Slot, Text

EDIT_VIEW = RowView(
    "decorrelation",
    # `original_image` only with --keep-original; queries have no captions.
    slots=(Slot("original_image", "original"), Slot("image", "synthetic", outline="mask")),
    texts=(
        Text("original_caption", "original caption", "strike", against="caption"),
        Text("caption", "synthetic caption"),
    ),
    facets=(Facet("removed class", ("removed_classes",)), Facet("removal", ("removal",))),
    histograms=("region_fraction",),
)
