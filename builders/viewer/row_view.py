"""How a table's rows are viewed: declared by each builder next to its schema, read by the gallery
and the card figures from the build manifest.

A builder passes `RowView.to_dict()` with each `OutputSpec`; the merge records it in the manifest
(`outputs[KEY]["view"]`), which is published with the shards, so a local build folder and a Hub
dataset at a revision carry their view alike. The viewer never imports a dataset package: the
view reaches it through the data. A table without a view (another project's dataset, a build
without images) is shown by `generic_view`: every image column, the string columns named
`caption`, `text` or `sentence`, and a `skip reason` facet.

Example (the decorrelation rows): `RowView("decorrelation", slots=(Slot("image", "synthetic",
outline="mask"),), texts=(Text("caption", "synthetic caption"),), facets=(Facet("removal",
("removal",)),), histograms=("region_fraction",))`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any, Sequence

log = logging.getLogger(__name__)

#: Text styles (rows.texts renders them).
TEXT_STYLES = ("plain", "highlight", "strike", "numbered", "grouped")
#: Facet styles (rows.facets renders them).
FACET_STYLES = ("values", "distinct", "nonzero")
_GENERIC_TEXT_COLUMNS = ("caption", "text", "sentence")


@dataclass(frozen=True)
class Slot:
    """One thumbnail of a row: the image column, its label, and a mask column to outline on it.
    A slot whose column the table lacks is left out."""

    column: str
    label: str
    outline: str | None = None


@dataclass(frozen=True)
class Text:
    """One caption block of a row (`segs`: plain, highlighted `hl` or struck through `del`).

    - `plain`: the cell, when it is a string.
    - `highlight`: the cell with the `word` column's value marked, at the `position` column's
      character offset when the word is there, else at its first whole-word occurrence.
    - `strike`: the cell (when not empty and `against` is not null) with the words missing from
      the `against` column struck through.
    - `numbered`: one block per item of a list cell, labelled `LABEL K`.
    - `grouped`: the items of a list cell grouped by the `group_by` column (one block per group,
      labelled `GROUP LABEL (N)`); a null item shows as `caption ID` from the `ids` column.
    """

    column: str
    label: str
    style: str = "plain"
    word: str | None = None
    position: str | None = None
    against: str | None = None
    group_by: str | None = None
    ids: str | None = None

    def __post_init__(self) -> None:
        if self.style not in TEXT_STYLES:
            raise ValueError(f"text style {self.style!r} is not one of {TEXT_STYLES}")


@dataclass(frozen=True)
class Facet:
    """One filter of the gallery and one bar chart of its stats page.

    - `values`: the cell's value(s) (the first of `columns` that is set).
    - `distinct`: the sorted distinct values of a list cell, or of its structs' `field`.
    - `nonzero`: the label (of `labels`, one per column) of every count column above 0, sorted.
    """

    name: str
    columns: tuple[str, ...]
    style: str = "values"
    field: str | None = None
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.style not in FACET_STYLES:
            raise ValueError(f"facet style {self.style!r} is not one of {FACET_STYLES}")


@dataclass(frozen=True)
class RowView:
    """How one table's rows are shown; `name` is the gallery's `kind`."""

    name: str
    slots: tuple[Slot, ...] = ()
    texts: tuple[Text, ...] = ()
    facets: tuple[Facet, ...] = ()
    #: Numeric columns whose distributions the stats page and the card plot (in this order).
    histograms: tuple[str, ...] = ()
    #: Columns left out of the provenance list (besides the images and the texts' columns).
    hidden: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The view as the manifest records it (JSON)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RowView:
        return cls(
            name=data["name"],
            slots=tuple(Slot(**s) for s in data.get("slots") or ()),
            texts=tuple(Text(**t) for t in data.get("texts") or ()),
            facets=tuple(
                Facet(**{**f, "columns": tuple(f["columns"]), "labels": tuple(f.get("labels") or ())})
                for f in data.get("facets") or ()
            ),
            histograms=tuple(data.get("histograms") or ()),
            hidden=tuple(data.get("hidden") or ()),
        )

    def slots_in(self, columns: Sequence[str]) -> list[Slot]:
        """The slots whose image column the table has."""
        return [s for s in self.slots if s.column in columns]

    @property
    def text_columns(self) -> set[str]:
        """Columns the texts show (left out of the provenance list)."""
        return {t.column for t in self.texts} | {t.group_by for t in self.texts if t.group_by}


def generic_view(columns: Sequence[str], image_columns: Sequence[str]) -> RowView:
    """The view of a table that declares none."""
    return RowView(
        "generic",
        slots=tuple(Slot(c, c) for c in image_columns),
        texts=tuple(Text(c, c) for c in columns if c in _GENERIC_TEXT_COLUMNS),
        facets=(Facet("skip reason", ("reason", "skip_reason")),),
    )


def view_of(output: dict[str, Any] | None, columns: Sequence[str], image_columns: Sequence[str]) -> RowView:
    """The view an output of the build manifest declares, else the generic one.

    The manifest may be anyone's (a dataset on the Hub): a declared view that does not parse is
    logged and the rows are shown with the generic view, never a traceback."""
    declared = output.get("view") if isinstance(output, dict) else None
    if declared:
        try:
            return RowView.from_dict(declared)
        except (TypeError, KeyError, ValueError, AttributeError) as err:
            log.warning(
                "the build manifest declares a view that does not parse (%s: %s); showing "
                "the rows with the generic view",
                type(err).__name__,
                err,
            )
    return generic_view(columns, image_columns)
