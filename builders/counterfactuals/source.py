"""The COCO-Counterfactuals builder's sources, read into its work items.

The captions stage reads `CaptionItem`s from COCO (`coco_captions`, annotation-file order) or from
any `datasets` split with a text column (`dataset_captions`); the images stage reads caption
pairs (`builders.counterfactuals.pair_tables`). A caption that is not usable text keeps its
`input_problem`, which the runner counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builders.counterfactuals.config import CocoCounterfactualsConfig
from builders.engine.dataset_source import load_dataset_split, stored_values
from builders.engine.errors import InputFileError, InputProblem


@dataclass
class CaptionItem:
    """One source caption: a work item of the captions stage."""

    id: str
    text: str
    source: str
    source_id: str
    source_image_id: str
    #: Set by the reader for a caption that is not usable text; the runner skips and counts it.
    input_problem: InputProblem | None = None


def coco_captions(cfg: CocoCounterfactualsConfig) -> list[CaptionItem]:
    """Every caption of the selected COCO folders, in annotation-file order (the order of
    `captions_<folder>.json`, folder by folder); `k` in the id `<image id>_<k>` counts an
    image's captions in that order, as the original release does (METHOD.md §1)."""
    from loading_scripts.coco import CocoSourceConfig, load_json, read_coco

    root = Path(cfg.coco_root)
    records = read_coco(
        CocoSourceConfig(root, coco_splits=cfg.coco_splits, karpathy_splits=cfg.karpathy_splits, with_instances=False)
    )
    # read_coco validated the files and sorts by ids; the file order is read here.
    folders = list(cfg.coco_splits) if cfg.coco_splits else sorted({r.folder for r in records})
    position = {}
    for rank, folder in enumerate(folders):
        anns = load_json(root / "annotations" / f"captions_{folder}.json", "captions")["annotations"]
        position.update({(folder, int(a["id"])): (rank, row) for row, a in enumerate(anns)})
    captions = sorted(
        ((rec, cap) for rec in records for cap in rec.captions),
        key=lambda rc: position[rc[0].folder, rc[1].caption_id],
    )
    seen: dict[int, int] = {}
    items = []
    for rec, cap in captions:
        k = seen[rec.image_id] = seen.get(rec.image_id, -1) + 1
        items.append(
            CaptionItem(
                id=f"{rec.image_id}_{k}",
                text=cap.text,
                source=f"coco/{rec.folder}",
                source_id=str(cap.caption_id),
                source_image_id=str(rec.image_id),
                input_problem=cap.input_problem,
            )
        )
    return items


def dataset_captions(cfg: CocoCounterfactualsConfig) -> list[CaptionItem]:
    """Every row of a `datasets` split with a text column, in row order (ids: `--id-column` or the row index)."""
    from loading_scripts.coco import caption_problem

    ds = load_dataset_split(cfg.dataset, cfg.dataset_config, cfg.dataset_split)
    missing = [c for c in (cfg.text_column, cfg.id_column) if c and c not in ds.column_names]
    if missing:
        raise InputFileError(
            cfg.dataset,
            f"has no column(s) {missing} (columns: {ds.column_names})",
            "pick them with --text-column / --id-column",
        )
    # As stored: a text column typed Image is a counted bad caption, its paths never opened.
    texts = stored_values(ds, cfg.text_column)
    ids = [str(x) for x in stored_values(ds, cfg.id_column)] if cfg.id_column else [str(i) for i in range(len(ds))]
    # A non-string or blank text is a counted input error, never coerced (`None` is no caption).
    return [
        CaptionItem(
            id=i,
            text=t if isinstance(t, str) else "",
            source=cfg.dataset,
            source_id=i,
            source_image_id="",
            input_problem=caption_problem(t, f"{cfg.dataset} row {n} ({cfg.text_column})"),
        )
        for n, (i, t) in enumerate(zip(ids, texts, strict=True))
    ]
