"""What the stats page counts: rows per facet value, skips per reason, numeric distributions,
images not shown per reason, images that carry a GPS position.

Facet counts, numbers and images not shown are gathered from the rows during the gallery's single
pass; skip and input-error counts come from the build manifest (the runner's per-part stats summed
at merge), since skipped items never become rows.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: Rows listed per reason an image is not shown (the count covers them all).
EXAMPLE_ROWS = 10


@dataclass
class GalleryStats:
    #: Numeric columns to gather for the histograms (the view's).
    histograms: tuple[str, ...] = ()
    rows: int = 0
    #: facet name -> value -> rows having it.
    facets: dict[str, Counter] = field(default_factory=dict)
    #: column -> finite values, for the histograms (8 bytes each, not a float object per row).
    numbers: dict[str, array] = field(default_factory=dict)
    #: reason -> images not shown (thumbnails.ThumbnailProblem), and the first rows holding one.
    images_not_shown: Counter = field(default_factory=Counter)
    rows_not_shown: dict[str, list[int]] = field(default_factory=dict)
    #: Images whose metadata holds a GPS position or could not be read fully (treated as holding
    #: one; `images_gps_unknown` of them), and the first rows holding one.
    images_with_gps: int = 0
    images_gps_unknown: int = 0
    rows_with_gps: list[int] = field(default_factory=list)

    def add(self, row: dict[str, Any], facets: dict[str, list[str]]) -> None:
        self.rows += 1
        for name, values in facets.items():
            self.facets.setdefault(name, Counter()).update(set(values))
        for column in self.histograms:
            value = row.get(column)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.numbers.setdefault(column, array("d")).append(float(value))

    def image_not_shown(self, index: int, reason: str) -> None:
        self.images_not_shown[reason] += 1
        rows = self.rows_not_shown.setdefault(reason, [])
        if len(rows) < EXAMPLE_ROWS and index not in rows:
            rows.append(index)

    def image_with_gps(self, index: int, unknown: bool = False) -> None:
        self.images_with_gps += 1
        self.images_gps_unknown += unknown
        if len(self.rows_with_gps) < EXAMPLE_ROWS and index not in self.rows_with_gps:
            self.rows_with_gps.append(index)

    def not_shown_counts(self) -> dict[str, int]:
        """Images not shown per reason, most frequent first."""
        return dict(sorted(self.images_not_shown.items(), key=lambda kv: (-kv[1], kv[0])))


def skip_counts(manifest: dict[str, Any] | None, config: str | None = None) -> dict[str, int]:
    """Items the build skipped, per reason (input errors prefixed `input: `). A combined build of
    several generators (`counterfactory renderings`) records each config's own skips."""
    if not manifest:
        return {}
    manifest = (manifest.get("renderings") or {}).get(config) or manifest
    counts = {str(k): int(v) for k, v in (manifest.get("skipped") or {}).items()}
    counts.update({f"input: {k}": int(v) for k, v in (manifest.get("errors") or {}).items()})
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
