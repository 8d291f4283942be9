"""Dataset cards rendered from the build manifest with huggingface_hub's card classes.

The card is generated, never hand-edited, so it cannot go stale: the YAML header (license, task
categories, `configs:` pointing at the shards, `dataset_info` with row counts) and the prose
(schema, counts, provenance, how it was built, limitations, citation) all come from the manifest
that the same build wrote.
"""

from __future__ import annotations

import math
from importlib import resources
from typing import Any

import datasets
from huggingface_hub import DatasetCard, DatasetCardData

from builders.engine.plain_text import code_span
from builders.engine.sharding.build_records import write_card as write_card_file
from builders.engine.sharding.layout import OutputLayout
from builders.engine.sharding.merge import record_files, write_manifest
from builders.viewer.card_figures import figures_markdown, write_card_figures


def _size_category(n: int) -> str:
    bounds = [
        (1_000, "n<1K"),
        (10_000, "1K<n<10K"),
        (100_000, "10K<n<100K"),
        (1_000_000, "100K<n<1M"),
        (10_000_000, "1M<n<10M"),
    ]
    for bound, label in bounds:
        if n < bound:
            return label
    return "n>10M"


def configs_yaml(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The README `configs:` entries: one per config, one `data_files` entry per split."""
    configs: dict[str, list[dict[str, str]]] = {}
    outputs = list(manifest["outputs"].values())
    # Outputs without rows get no shard (see sharding.merge) and no entry; an all-empty build
    # still lists them (patterns matching nothing), as loaders left without `configs:` would take
    # build_manifest.json for the data.
    for out in [o for o in outputs if o["rows"]] or outputs:
        configs.setdefault(out["config"], []).append(
            {"split": out["split"], "path": f"{out['data_dir']}/{out['split']}-*"}
        )
    entries = [{"config_name": name, "data_files": files} for name, files in configs.items()]
    if "default" not in configs and entries:
        entries[0]["default"] = True
    return entries


def dataset_info_yaml(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    infos = []
    by_config: dict[str, list[dict[str, Any]]] = {}
    for out in manifest["outputs"].values():
        if out["rows"]:
            by_config.setdefault(out["config"], []).append(out)
    for config, outs in by_config.items():
        features = datasets.Features.from_dict(outs[0]["features"])
        infos.append(
            {
                "config_name": config,
                "features": features._to_yaml_list(),
                # num_bytes is the parquet size on disk (what a user downloads).
                "splits": [{"name": o["split"], "num_bytes": o["bytes"], "num_examples": o["rows"]} for o in outs],
            }
        )
    return infos


def schema_rows(manifest: dict[str, Any]) -> list[dict[str, str]]:
    """One row per (config, column) with its type, for the card's schema table."""
    rows = []
    seen = set()
    for out in manifest["outputs"].values():
        if out["config"] in seen:
            continue
        seen.add(out["config"])
        features = datasets.Features.from_dict(out["features"])
        for name, feature in features.items():
            rows.append({"config": out["config"], "column": name, "type": _type_name(feature)})
    return rows


def _type_name(feature: Any) -> str:
    if isinstance(feature, datasets.Value):
        return feature.dtype
    if isinstance(feature, datasets.Image):
        return "image"
    if isinstance(feature, (datasets.List, datasets.LargeList)):
        return f"list<{_type_name(feature.feature)}>"
    if isinstance(feature, dict):
        return "struct{" + ", ".join(f"{k}: {_type_name(v)}" for k, v in feature.items()) + "}"
    return type(feature).__name__


def image_metadata_note(config: Any) -> str | None:
    """What the card says of the stored source images' metadata, from the config's
    `strip_metadata` (`--strip-metadata`, at any depth of the config); None without one."""
    if isinstance(config, dict):
        if isinstance(config.get("strip_metadata"), bool):
            if config["strip_metadata"]:
                return (
                    "Image metadata: stripped. Of the source images' bytes only what decoding and colour "
                    "need was kept (`--strip-metadata`, an allow-list, without re-encoding): their EXIF "
                    "(with any GPS position), XMP, comments and any other metadata were dropped."
                )
            return (
                "Image metadata: kept. Source images stored as their files' bytes keep whatever metadata "
                "the files carry (EXIF, which can hold a GPS position and the camera, XMP, comments); "
                "`--strip-metadata` would drop it, and `counterfactory show` flags images with a GPS position."
            )
        return next(filter(None, map(image_metadata_note, config.values())), None)
    return None


def render_card(manifest: dict[str, Any], repo_id: str | None = None, version: str | None = None) -> str:
    """Render the README (YAML header + card) for a build, optionally for a published version."""
    fields = manifest.get("card_fields", {})
    total_rows = sum(o["rows"] for o in manifest["outputs"].values())
    card_data = DatasetCardData(
        license=fields.get("license", "other"),
        language=fields.get("language", ["en"]),
        task_categories=fields.get("task_categories"),
        tags=fields.get("tags"),
        pretty_name=manifest["pretty_name"],
        size_categories=[_size_category(total_rows)] if not math.isnan(total_rows) else None,
        source_datasets=fields.get("source_datasets"),
        configs=configs_yaml(manifest),
        dataset_info=dataset_info_yaml(manifest),
    )
    template = resources.files("dataset_cards").joinpath(manifest["card_template"])
    card = DatasetCard.from_template(
        card_data,
        template_str=template.read_text(encoding="utf-8"),
        manifest=manifest,
        fields=fields,
        repo_id=repo_id or "ORG/NAME",
        version=version,
        schema=schema_rows(manifest),
        total_rows=total_rows,
        figures=figures_markdown(manifest),
        code=code_span,
        image_metadata=image_metadata_note(manifest.get("config")),
    )
    return str(card)


def write_card(layout: OutputLayout, manifest: dict[str, Any], written: set[str]) -> None:
    """Finish a merged build (`sharding.merge.Finisher`): its card figures, manifest and card.

    The figures (the card's example grid and histograms, `figures/*.png`) are published with the
    shards, so the manifest lists them; the card is rendered from that manifest, which is written
    last (its presence marks a finished build, card included).
    """
    manifest["card_figures"] = write_card_figures(layout.out, manifest)
    record_files(layout, manifest, written | {figure["path"] for figure in manifest["card_figures"]})
    write_card_file(layout, manifest, render_card(manifest))
    write_manifest(layout, manifest)
