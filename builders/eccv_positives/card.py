"""Card fields of an eccv-positives build: counts recomputed from the data, every choice made."""

from __future__ import annotations

from typing import Any

from builders.eccv_positives.config import EccvImportConfig
from builders.eccv_positives.schema import COLUMN_DOCS

CITATION = """@inproceedings{chun2022eccv_caption,
  title={ECCV Caption: Correcting False Negatives by Collecting Machine-and-Human-verified Image-Caption Associations for MS-COCO},
  author={Chun, Sanghyuk and Kim, Wonjae and Park, Song and Chang, Minsuk and Oh, Seong Joon},
  booktitle={European Conference on Computer Vision (ECCV)}, year={2022}}
@inproceedings{parekh2021crisscrossed,
  title={Crisscrossed Captions: Extended Intramodal and Intermodal Semantic Similarity Judgments for MS-COCO},
  author={Parekh, Zarana and Baldridge, Jason and Cer, Daniel and Waters, Austin and Yang, Yinfei},
  booktitle={EACL}, year={2021}}
@inproceedings{lin2014microsoft, title={Microsoft COCO: Common Objects in Context},
  author={Lin, Tsung-Yi and others}, booktitle={ECCV}, year={2014}}"""


def _summary(mitl: dict[str, Any] | None) -> str:
    """The card's first line; a version annotated over another dataset's gallery merged no COCO
    list unless asked (`--coco-ids`), so it says what it holds."""
    if mitl and mitl.get("gallery") == "dataset":
        merged = " and CrissCrossed Captions" if mitl.get("cxc_merged") else ""
        return (
            "Image-to-caption and caption-to-image positives of an image-caption dataset: the "
            f"original pairs, machine-and-human-verified positives{merged}, as parquet (no "
            "loading script)."
        )
    return (
        "Image-to-caption and caption-to-image positives of COCO retrieval: ECCV Caption "
        "(machine-and-human-verified), CrissCrossed Captions and the original COCO pairs, "
        "as parquet (no loading script)."
    )


def card_fields(config: EccvImportConfig, stats: dict[str, Any], mitl: dict[str, Any] | None) -> dict[str, Any]:
    """`BuildInfo.card_fields` of a build of `config`."""
    source = (
        "the annotation files shipped in the `eccv_caption` package (the published ECCV "
        "Caption, CxC and COCO 5K test positives)"
        if not config.annotations_dir
        else f"the positives written by `counterfactory eccv ingest` (`{config.annotations_dir}`)"
    )
    how = [
        f"Positives read from {source}; one row per query of any source, positives in file order.",
        "Each ECCV positive labelled coco / cxc / eccv by the most established source holding it.",
        (
            "Images and caption texts from the COCO root; rows whose items it lacks keep null image/text."
            if config.coco_root
            else "No COCO root: image and text columns are null."
        ),
        (
            f"PM pseudo-positives from COCO instance classes, zeta = {config.pm_zeta}, the query's own image excluded."
            if config.with_pm and config.coco_root
            else "No PM config."
        ),
        "The `removed` config lists the captions and the image removed by the paper (Appendix C.1).",
    ]
    return {
        "license": "cc-by-4.0",
        "task_categories": ["image-to-text", "text-to-image"],
        "tags": ["coco", "retrieval", "eccv-caption", "false-negatives"],
        "source_datasets": ["MS-COCO"],
        "summary": _summary(mitl),
        "column_docs": COLUMN_DOCS,
        "how_built": how,
        "stats": stats,
        "mitl": mitl,
        "limitations": [
            "Crowd-sourced positives contain some false positives (the paper's Appendix F); "
            "`Partially YES` answers count as positives.",
            "Positives were proposed by machine annotators, so they are biased towards what those "
            "models retrieve (the paper's Appendix E).",
            "Images keep the COCO license terms of their Flickr sources.",
        ],
        "license_text": "COCO captions and CxC annotations are CC BY 4.0; the ECCV Caption "
        "annotations are distributed by their authors with the `eccv_caption` "
        "package (naver-ai/eccv-caption); images follow the Flickr terms of COCO.",
        "citation": CITATION,
    }
