"""The annotation sets a build publishes, and what the card says about them.

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

from loading_scripts.eccv import Positives, read_positives

#: Provenance labels, most established first.
SOURCE_LABELS = ("coco", "cxc", "eccv")
#: File written next to the positives by `counterfactory eccv ingest` (counts and choices).
MITL_REPORT = "mitl_report.json"

# Chun et al., ECCV 2022, Appendix C.1: captions removed from the ECCV Caption test split
# (18 meaningless, 14 semantically wrong) and the test image duplicated in the training set.
MEANINGLESS_CAPTIONS = {
    607516: "The first picture is blank all the time on purpose.",
    607486: "Why is my first one a blank every time.",
    433639: "There is no image here to provide a caption for.",
    248212: "I am unable to see an image above.",
    469834: "There is no image here to provide a caption for.",
    462530: "I really cant see this image very well.",
    469102: "There is no image to be reviewed on this hit.",
    743575: "There is no image showing on this page to describe.",
    246706: "I am unable to see an image above.",
    61717: "There is no picture here to describe with a caption.",
    500797: "I am unable to see the image above.",
    19273: "There is no image for me to write about.",
    630298: "There is no image to provide a caption for.",
    576409: "I am unable to see the image above.",
    390637: "I am unable to see an image above.",
    296557: "There is no image here to provide a caption for.",
    450553: "I am unable to see an image above.",
    44809: "blank image with no pictures available to write about",
}
WRONG_CAPTIONS = {
    610564: "An individual is in the open view in the image.",
    359139: "I cant tell if the bears may be fighting or kissing.",
    218995: "A baseball player hugging another player as lovers do.",
    609235: "Individuals are up and doing something fun today.",
    143250: "The bar of the small bathroom has many remotes on it.",
    375316: "A photo duplicated a few times and put together.",
    712683: "Talk about a bad hair day, his is frightful.",
    75083: "A group of birds flying above the beach.",
    625605: "It is always wise to have bottles of water on hand in case of an emergency.",
    620511: "If the motorcycle brakes down, the bicycle will be good transportation.",
    613949: "A full view of an outdoor space with many things to see.",
    129825: "A picture of a comment that is open.",
    605566: "There is a room with various items in the picture.",
    634829: "That thing is really red and slow lol",
}
DUPLICATE_IMAGES = {
    578492: "COCO_val2014_000000578492.jpg duplicates COCO_train2014_000000388662.jpg and "
            "COCO_train2014_000000397819.jpg",
}
INVALID_CAPTION_IDS = frozenset(MEANINGLESS_CAPTIONS) | frozenset(WRONG_CAPTIONS)


def removed_rows() -> list[dict[str, Any]]:
    """The Appendix C.1 list as rows of the `removed` config."""
    rows = [{"kind": "caption", "id": i, "reason": "meaningless", "text": t}
            for i, t in MEANINGLESS_CAPTIONS.items()]
    rows += [{"kind": "caption", "id": i, "reason": "semantically_wrong", "text": t}
             for i, t in WRONG_CAPTIONS.items()]
    rows += [{"kind": "image", "id": i, "reason": "duplicate_of_train_image", "text": t}
             for i, t in DUPLICATE_IMAGES.items()]
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
        return ["coco" if p in coco else "cxc" if p in cxc else "eccv"
                for p in getattr(self.eccv, modality)[query].tolist()]

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
                "eccv_queries": len(eccv), "eccv_positives": n_eccv,
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
