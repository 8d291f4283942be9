"""How the image queries (`i2t`) are viewed: the query image and its positive captions grouped by
source (caption ids when the build had no COCO captions), a facet by positive source."""

from __future__ import annotations

from builders.viewer.row_view import Facet, RowView, Slot, Text

I2T_VIEW = RowView(
    "eccv_positives",
    slots=(Slot("image", "query image"),),
    texts=(
        Text("positive_captions", "positives", "grouped", group_by="positive_sources", ids="positive_caption_ids"),
    ),
    facets=(Facet("positive source", ("positive_sources",), "distinct"),),
)
