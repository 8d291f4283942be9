"""ECCV Caption positives as Hub parquet: `counterfactory build eccv-positives`.

Reads the positive sets (from the `eccv_caption` package, or a folder written by
`counterfactory eccv ingest`) and, optionally, a COCO root for images, caption texts and
instances, and writes:

    i2t/test      one row per image query of any source: image, its ECCV positives (caption ids,
                  texts, provenance label each), its CxC and original COCO positives
    t2i/test      one row per caption query: caption, its ECCV / CxC / COCO positive image ids
    pm/i2t, pm/t2i  plausible-match pseudo-positives from COCO instances (needs --coco-root):
                  query_id -> pm_positive_ids (captions of an image query, images of a caption)
    removed/test  the captions and the image the ECCV Caption paper removes (Appendix C.1)

Rows exist for every annotated query whether or not the COCO root holds it: image and text
columns are then null, so the published positives always equal the annotation files exactly
(see METHOD.md §1). Each work item carries everything its row is made of except the pixels
(`RowItem`), so the runner's per-item digests cover the COCO root too and a resume on changed
captions, images or instances is refused; COCO records the reader marked malformed are counted
input errors, never published (METHOD.md §1).

    counterfactory build eccv-positives --coco-root COCO --output out/eccv-positives
    accelerate launch builders/eccv_positives/builder.py --coco-root COCO --output out/...
"""

from __future__ import annotations

import hashlib
import logging
import argparse
import sys
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from builders.eccv_positives import options
from builders.eccv_positives.config import EccvImportConfig
from builders.eccv_positives.schema import I2T, PM, REMOVED, T2I
from builders.eccv_positives.source import AnnotationSet, CocoRoot, read_coco_root, read_mitl_report, removed_rows
from builders.eccv_positives.view import I2T_VIEW
from builders.engine.errors import InputProblem
from builders.engine.sharding.base import BuildInfo, Emit, OutputSpec, Skip
from loading_scripts.images import IMAGE_ENCODING

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowItem:
    """One output row's inputs, all but the pixels. The runner digests what an item holds (its
    repr, plus the size and mtime of `path`) and skips and counts an item with an
    `input_problem`, so both resume checks and bad-record counting see everything the row reads
    (builders.engine.sharding.inputs)."""

    #: Output key (`i2t/test`, ...) and how resume messages name the item (`caption id 42`).
    output: str
    label: str
    row: dict[str, Any]
    #: The image file of an `i2t/test` row, when the COCO root holds it, and its annotated size.
    path: Path | None = None
    input_problem: InputProblem | None = None
    size: tuple[int, int] | None = None


class EccvPositivesBuilder:
    def __init__(self, config: EccvImportConfig) -> None:
        self.config = config

    def outputs(self):
        return [
            OutputSpec("i2t", "test", I2T, I2T_VIEW.to_dict()),
            OutputSpec("t2i", "test", T2I),
            OutputSpec("pm", "i2t", PM),
            OutputSpec("pm", "t2i", PM),
            OutputSpec("removed", "test", REMOVED),
        ]

    @cached_property
    def annotations(self) -> AnnotationSet:
        return AnnotationSet.load(self.config.annotations_dir)

    @cached_property
    def coco(self) -> CocoRoot:
        return read_coco_root(self.config)

    @cached_property
    def pm(self):
        from loading_scripts.eccv import Positives, pm_positives

        wanted = self.annotations.coco.i2t
        classes = {i: c for i, c in self.coco.classes.items() if i in wanted}
        if not (self.config.with_pm and classes):
            if self.config.with_pm:
                log.warning("no instances for the annotated images under --coco-root: the pm config is left out")
            return Positives({}, {})
        # The query's own image (and so its own captions) is no PM positive: PM is meant to find
        # positives beyond the original pairs (METHOD.md §1).
        return pm_positives(classes, wanted, self.config.pm_zeta, omit_own_image=True)

    def source_option(self) -> str:
        return f"--annotations-dir {self.config.annotations_dir or '(the eccv_caption package)'}"

    def work_items(self) -> list[RowItem]:
        removed = [RowItem("removed/test", f"removed #{n}", row) for n, row in enumerate(removed_rows())]
        return (
            [self._image_item(i) for i in self.annotations.image_queries()]
            + [self._caption_item(c) for c in self.annotations.caption_queries()]
            + [
                RowItem(
                    f"pm/{direction}", f"pm {direction} query {q}", {"query_id": q, "pm_positive_ids": ids[q].tolist()}
                )
                for direction, ids in (("i2t", self.pm.i2t), ("t2i", self.pm.t2i))
                for q in sorted(ids)
            ]
            + removed
        )

    def process(self, items):
        from loading_scripts.images import ImageProblem, check_image

        for item in items:
            row = item.row
            if item.output == "i2t/test" and item.path:
                try:
                    row = {
                        **row,
                        "image": check_image(
                            item.path, expected_size=item.size, max_pixels=self.config.max_image_pixels
                        ).cell(self.config.strip_metadata),
                    }
                except ImageProblem as err:
                    yield Skip(err.reason, kind="error", detail=str(err))
                    continue
            elif item.output == "i2t/test":
                row = {**row, "image": None}
            yield Emit(item.output, row)

    def _image_item(self, image_id: int) -> RowItem:
        ann, coco = self.annotations, self.coco
        label = f"image id {image_id}"
        if image_id in coco.problems:
            # Never reaches `process`: the runner counts it under the reader's reason.
            path, problem = coco.problems[image_id]
            return RowItem("i2t/test", label, {"image_id": image_id}, path, problem)
        eccv = image_id in ann.eccv.i2t
        positives = ann.eccv.i2t[image_id].tolist() if eccv else []
        path, size = coco.images.get(image_id, (None, None))
        return RowItem(
            "i2t/test",
            label,
            {
                "image_id": image_id,
                "file_name": path.name if path else None,
                "eccv_query": eccv,
                "positive_caption_ids": positives,
                "positive_captions": [coco.captions.get(c) for c in positives],
                "positive_sources": ann.labels("i2t", image_id) if eccv else [],
                "cxc_caption_ids": _ids(ann.cxc.i2t, image_id),
                "coco_caption_ids": _ids(ann.coco.i2t, image_id),
            },
            path,
            size=size,
        )

    def _caption_item(self, caption_id: int) -> RowItem:
        ann = self.annotations
        eccv = caption_id in ann.eccv.t2i
        original = ann.coco.t2i.get(caption_id)
        return RowItem(
            "t2i/test",
            f"caption id {caption_id}",
            {
                "caption": self.coco.captions.get(caption_id),
                "caption_id": caption_id,
                "image_id": int(original[0]) if original is not None and len(original) else None,
                "eccv_query": eccv,
                "positive_image_ids": ann.eccv.t2i[caption_id].tolist() if eccv else [],
                "positive_sources": ann.labels("t2i", caption_id) if eccv else [],
                "cxc_image_ids": _ids(ann.cxc.t2i, caption_id),
                "coco_image_ids": _ids(ann.coco.t2i, caption_id),
            },
        )

    def info(self):
        from builders.eccv_positives.card import card_fields

        mitl = read_mitl_report(self.config.annotations_dir)
        return BuildInfo(
            builder="eccv-positives",
            card_template="eccv_positives.md",
            pretty_name="ECCV Caption positives"
            if not self.config.annotations_dir
            else "ECCV Caption-style positives (new MITL version)",
            config=self._config_record(),
            # The round's machine annotators, as `eccv candidates` named them (a round recorded
            # by an older version may hold the specs as given: the manifest names those too).
            models={f"annotator_{n}": m for n, m in enumerate(mitl["models"] if mitl else [], 1)},
            card_fields=card_fields(self.config, self.annotations.statistics(), mitl),
        )

    def _config_record(self) -> dict[str, Any]:
        """The config, how images are stored, plus a digest of a custom annotation folder:
        re-ingesting verdicts changes the files, not the folder name, and must not resume a build
        made from the old ones."""
        record: dict[str, Any] = {**asdict(self.config), "image_encoding": IMAGE_ENCODING}
        if self.config.annotations_dir:
            digest = hashlib.sha256()
            for path in sorted(Path(self.config.annotations_dir).glob("*.json")):
                digest.update(path.name.encode() + path.read_bytes())
            record["annotations_sha256"] = digest.hexdigest()
        return record


def _ids(mapping: dict, key: int) -> list[int] | None:
    """A query's positives, or None when the source has no such query (not the same as [])."""
    return mapping[key].tolist() if key in mapping else None


def from_args(args: argparse.Namespace) -> EccvPositivesBuilder:
    """The builder of `counterfactory build eccv-positives` (`builders.app.registry`) and of
    `accelerate launch` below, from the options (options.py, which never imports this module)."""
    return EccvPositivesBuilder(options.config_from_args(args))


if __name__ == "__main__":
    from builders.launch import launch_main

    sys.exit(launch_main(options, from_args))
