"""What an eccv-positives build reads: the annotation sets it publishes (and what the card says
about them), the MITL report of a new version, and the well-formed records of a COCO root; and
`write_positives`, the writer of the annotation files, with which `eccv ingest` makes a new version.

A build reads three positive sets in the `eccv_caption` file format (`loading_scripts.eccv`):
`eccv` (ECCV Caption: human-verified machine proposals merged with CxC), `cxc` (CrissCrossed
Captions) and `coco` (the original COCO pairs). They come from the installed `eccv_caption`
package, or from a folder written by `counterfactory eccv ingest` (a new MITL version).

Each ECCV positive gets one provenance label, the most established source that also holds it:
`coco` (an original COCO pair), else `cxc` (a CxC positive), else `eccv` (found only by the
machine-in-the-loop annotation). The labels are derived, so the published files stay the truth.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from builders.eccv_positives.config import (
    DUPLICATE_IMAGES,
    INVALID_CAPTION_IDS,
    MEANINGLESS_CAPTIONS,
    MITL_REPORT,
    SOURCE_LABELS,
    WRONG_CAPTIONS,
    EccvImportConfig,
)
from builders.engine.errors import InputProblem
from loading_scripts.eccv import Positives, read_positives


def removed_rows() -> list[dict[str, Any]]:
    """The Appendix C.1 list as rows of the `removed` config."""
    rows = [{"kind": "caption", "id": i, "reason": "meaningless", "text": t} for i, t in MEANINGLESS_CAPTIONS.items()]
    rows += [
        {"kind": "caption", "id": i, "reason": "semantically_wrong", "text": t} for i, t in WRONG_CAPTIONS.items()
    ]
    rows += [
        {"kind": "image", "id": i, "reason": "duplicate_of_train_image", "text": t}
        for i, t in DUPLICATE_IMAGES.items()
    ]
    return rows


@dataclass(frozen=True)
class AnnotationSet:
    """The three positive sets of one build."""

    eccv: Positives
    cxc: Positives
    coco: Positives

    @classmethod
    def load(cls, directory: str | Path | None = None) -> AnnotationSet:
        """From `directory` (files named like the package's), or the installed `eccv_caption`."""
        folder = Path(directory) if directory else None
        return cls(*(read_positives(s, folder) for s in ("eccv", "cxc", "coco")))

    def image_queries(self) -> list[int]:
        """Every image that is a query of any source, ascending."""
        return sorted(set(self.eccv.i2t) | set(self.cxc.i2t) | set(self.coco.i2t))

    def caption_queries(self) -> list[int]:
        return sorted(set(self.eccv.t2i) | set(self.cxc.t2i) | set(self.coco.t2i))

    def labels(self, modality: str, query: int) -> list[str]:
        """The provenance label of each ECCV positive of `query`, in file order."""
        coco = set(getattr(self.coco, modality).get(query, np.empty(0)).tolist())
        cxc = set(getattr(self.cxc, modality).get(query, np.empty(0)).tolist())
        return [
            "coco" if p in coco else "cxc" if p in cxc else "eccv"
            for p in getattr(self.eccv, modality)[query].tolist()
        ]

    def statistics(self) -> dict[str, Any]:
        """Counts for the card, all recomputed from the files."""
        stats: dict[str, Any] = {}
        for modality in ("i2t", "t2i"):
            eccv = getattr(self.eccv, modality)
            coco = getattr(self.coco, modality)
            labels = Counter(lab for q in eccv for lab in self.labels(modality, q))
            n_eccv = sum(len(v) for v in eccv.values())
            n_coco = sum(len(coco.get(q, ())) for q in eccv)
            stats[modality] = {
                "eccv_queries": len(eccv),
                "eccv_positives": n_eccv,
                "positives_by_source": {s: labels.get(s, 0) for s in SOURCE_LABELS},
                "coco_positives_of_eccv_queries": n_coco,
                # Table 3 of the paper: x3.58 captions per image query, x8.47 images per caption.
                "multiplicity": round(n_eccv / n_coco, 2) if n_coco else None,
                "cxc_queries": len(getattr(self.cxc, modality)),
                "cxc_positives": sum(len(v) for v in getattr(self.cxc, modality).values()),
                "coco_queries": len(coco),
                "coco_positives": sum(len(v) for v in coco.values()),
            }
        listed = {int(c) for v in self.eccv.i2t.values() for c in v.tolist()}
        stats["invalid_captions_still_positive"] = sorted(listed & INVALID_CAPTION_IDS)
        return stats


def read_mitl_report(directory: str | Path | None) -> dict[str, Any] | None:
    """The ingest report stored next to a new version's positives, if any."""
    if directory is None:
        return None
    path = Path(directory) / MITL_REPORT
    return json.loads(path.read_text()) if path.is_file() else None


@dataclass(frozen=True)
class CocoRoot:
    """What the build needs from a COCO root: texts, image paths, instance classes — of the
    well-formed records only — and why each malformed record is left out."""

    captions: dict[int, str]
    #: image id -> its file and annotated (width, height).
    images: dict[int, tuple[Path, tuple[int, int]]]
    classes: dict[int, list[int]]
    #: image id -> (its path, the reader's reason): the record is not used at all (METHOD.md §1).
    problems: dict[int, tuple[Path, InputProblem]]


def read_coco_root(config: EccvImportConfig) -> CocoRoot:
    """What the build needs from `config.coco_root` (empty without one)."""
    if not config.coco_root:
        return CocoRoot({}, {}, {}, {})
    from loading_scripts.coco import CocoSourceConfig, read_coco

    records = read_coco(CocoSourceConfig(Path(config.coco_root), with_instances=config.with_pm))
    # A malformed record is left out whole, as the other builders skip the whole image: no
    # caption of it (not even the well-formed ones) and no instance class reaches a row.
    good = [r for r in records if r.input_problem is None]
    return CocoRoot(
        captions={c.caption_id: c.text for r in good for c in r.captions},
        images={r.image_id: (r.path, (r.width, r.height)) for r in good},
        classes={r.image_id: sorted({o.category_id for o in r.objects}) for r in good if r.objects},
        problems={r.image_id: (r.path, r.input_problem) for r in records if r.input_problem is not None},
    )


def write_positives(positives: Positives, directory: str | Path, source: str) -> None:
    """Write `positives` as the `eccv_caption` file pair of `source` (eccv, cxc or coco)."""
    prefix = {"eccv": "eccv", "cxc": "cxc", "coco": "original"}[source]
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    for name, mapping in (("image_to_caption", positives.i2t), ("caption_to_image", positives.t2i)):
        data = {str(q): [int(i) for i in ids] for q, ids in mapping.items()}
        tmp = folder / f".{prefix}_{name}.json.tmp"
        tmp.write_text(json.dumps(data))
        tmp.replace(folder / f"{prefix}_{name}.json")
