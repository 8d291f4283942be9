"""How the image rows (`default`) are viewed: the image, its numbered captions, a facet by the
classes of its boxes."""

from __future__ import annotations

from builders.viewer.row_view import Facet, RowView, Slot, Text

IMAGES_VIEW = RowView(
    "coco_captions",
    slots=(Slot("image", "image"),),
    texts=(Text("captions", "caption", "numbered"),),
    facets=(Facet("class", ("objects",), "distinct", field="category"),),
)
