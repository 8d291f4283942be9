"""What the stats page counts: rows per facet value, skips per reason, numeric distributions.

Facet counts and numbers are gathered from the rows during the gallery's single pass; skip and
input-error counts come from the build manifest (the runner's per-part stats summed at merge),
since skipped items never become rows.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from builders.infra.gallery.rows import HISTOGRAM_COLUMNS


@dataclass
class GalleryStats:
    rows: int = 0
    #: facet name -> value -> rows having it.
    facets: dict[str, Counter] = field(default_factory=dict)
    #: column -> finite values, for the histograms.
    numbers: dict[str, list[float]] = field(default_factory=dict)

    def add(self, row: dict[str, Any], facets: dict[str, list[str]]) -> None:
        self.rows += 1
        for name, values in facets.items():
            self.facets.setdefault(name, Counter()).update(set(values))
        for column in HISTOGRAM_COLUMNS:
            value = row.get(column)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.numbers.setdefault(column, []).append(float(value))


def skip_counts(manifest: dict[str, Any] | None) -> dict[str, int]:
    """Items the build skipped, per reason (input errors prefixed `input: `)."""
    if not manifest:
        return {}
    counts = {str(k): int(v) for k, v in (manifest.get("skipped") or {}).items()}
    counts.update({f"input: {k}": int(v) for k, v in (manifest.get("errors") or {}).items()})
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
