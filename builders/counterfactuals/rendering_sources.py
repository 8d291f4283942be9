"""The builds `counterfactory renderings` combines: finished coco-counterfactuals builds of one
caption-pair table, one per `--generator` (`builders.counterfactuals.renderings`).

Each build folder is the user's declared input, and only what its own `build_manifest.json` lists
is read: the manifest itself and the listed shards and figures, each reached without following a
symlink (a planted link to a file elsewhere is refused, never read) and checked against the size
and sha256 the manifest records. Everything is checked before anything is written, so a refused
set of builds leaves the output folder as it was:

- the folder is a finished build (no build holds its lock, its manifest is there and readable)
  of `coco-counterfactuals`, whose image stage ran a generator (not a captions-only build, not
  imported image pairs);
- every build has its own generator;
- all render the same caption-pair table (`table_keys`): the caption stage's source and options,
  or the digests of the table `--captions-from` read.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from builders.counterfactuals.generators import GENERATORS
from builders.counterfactuals.images import (
    EDIT_BEYOND_TEXT_ENCODER,
    EDIT_INVISIBLE_TO_TEXT_ENCODER,
    NO_PASSING_CANDIDATE,
)
from builders.engine.errors import UserFacingError
from builders.engine.no_follow import open_no_follow
from builders.engine.sharding.build_files import FILES, listed_paths
from builders.engine.sharding.layout import MANIFEST, OutputLayout

#: The image stage's outcomes for a caption pair it was given and drew no row for: with the rows,
#: the pairs each generator was given (its `pairs_in`).
IMAGE_STAGE_SKIPS = (NO_PASSING_CANDIDATE, EDIT_BEYOND_TEXT_ENCODER, EDIT_INVISIBLE_TO_TEXT_ENCODER)
#: Caption-stage fields that say how fast, not which pairs: `order` and `probe` make the same
#: choice (`CaptionStageConfig`), the batch sizes only group the work.
_HOW_NOT_WHAT = ("order", "probe", "caption_batch", "encode_batch", "lm_batch")
#: The config fields that decide a caption stage's pairs (beside `captions` and the text models).
_CAPTION_SOURCE = (
    "coco_root",
    "coco_splits",
    "karpathy_splits",
    "dataset",
    "dataset_config",
    "dataset_split",
    "text_column",
    "id_column",
    "max_captions",
    "split",
)
#: How `--stage images` read its `--captions-from` table (all but the table's own digests).
_TABLE_READING = (
    "id_column",
    "caption_0_column",
    "caption_1_column",
    "captions_split",
    "allow_multiword_edits",
    "max_captions",
    "split",
)
_FINISH = "run or resume its `counterfactory build coco-counterfactuals` command until it finishes"


@dataclass
class RenderingSource:
    """One build folder to combine, read and checked (`read_source`)."""

    folder: Path
    manifest: dict[str, Any]
    #: `local:NAME@sha256:DIGEST`: the folder's name and its manifest's digest (which lists the
    #: digest of every file), as provenance names local things.
    name: str

    @property
    def config(self) -> dict[str, Any]:
        return self.manifest["config"]

    @property
    def generator(self) -> str:
        return self.config["images"]["generator"]

    @property
    def split(self) -> str:
        return self.config["split"]

    def output(self, config: str) -> dict[str, Any] | None:
        return self.manifest["outputs"].get(f"{config}/{self.split}")

    def image_skips(self) -> dict[str, int]:
        skipped = self.manifest.get("skipped") or {}
        return {reason: int(skipped[reason]) for reason in IMAGE_STAGE_SKIPS if skipped.get(reason)}

    def record(self, rel: str) -> dict[str, Any]:
        """The manifest's `files` entry of the listed file `rel`."""
        for entry in self.manifest[FILES]:
            if entry["path"] == rel:
                return entry
        raise UserFacingError(
            f"{self.folder / MANIFEST} names {rel!r} as a shard or figure but does not list it "
            "under `files`; the manifest was edited or damaged — re-run the build command"
        )


def read_source(folder: Path) -> RenderingSource:
    """The finished coco-counterfactuals build in `folder`, or one line saying why it is not one."""
    from builders.engine.sharding.output_guard import build_in_progress

    if not folder.is_dir():
        raise UserFacingError(f"{folder} is not a folder; give the --output folder of a coco-counterfactuals build")
    if build_in_progress(OutputLayout(folder)):
        raise UserFacingError(f"a build is still writing to {folder}; combine it once that build has finished")
    try:
        data = b"".join(_listed_chunks(folder, MANIFEST))
    except FileNotFoundError:
        raise UserFacingError(f"{folder} is not a finished build (it has no {MANIFEST}): {_FINISH}") from None
    try:
        manifest = json.loads(data)
        builder, config, outputs = manifest["builder"], manifest["config"], manifest["outputs"]
        listed_paths(manifest, folder)
        if builder != "coco-counterfactuals":
            raise UserFacingError(
                f"{folder} is a {builder!r} build, not a coco-counterfactuals one; give one "
                "`counterfactory build coco-counterfactuals --generator G` build per generator"
            )
        source = RenderingSource(folder, manifest, f"local:{folder.resolve().name}@sha256:{_digest(data)}")
        _check_image_stage(source, config, outputs)
        table_keys(source)  # reads the fields that name its caption-pair table
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise UserFacingError(
            f"{folder / MANIFEST} is damaged ({type(err).__name__}: {err}); re-run the build command to write it again"
        ) from None
    return source


#: The manifest fields `renderings` reads, parents first, as a build writes them (kind, and whether
#: it must be there): an edited manifest is refused naming the field, not by a TypeError or
#: KeyError where the value is used.
_SHAPE: dict[str, tuple[type, bool]] = {
    "config": (dict, True),
    "outputs": (dict, True),
    "models": (dict, True),
    "counts": (dict, False),
    "skipped": (dict, False),
    "card_fields": (dict, False),
    "card_figures": (list, False),
    "config.split": (str, True),
    "config.images": (dict, True),
    "config.images.generator": (str, True),
    "config.images.steps": (int, True),
    "config.images.image_size": (int, True),
    "config.generator": (dict, True),
    "config.generator.method": (str, True),
    "config.generator.license": (str, True),
    "config.generator.default_model": (str, True),
    "config.captions": (dict, False),
    "config.models": (dict, False),
    "config.captions_table": (dict, False),
    "config.captions_table.files": (dict, False),
}
_JSON = {dict: "an object", str: "a string", list: "a list", int: "an integer"}


def _check_shape(manifest: dict[str, Any], complete: bool) -> None:
    """The kinds of the `_SHAPE` fields there; with `complete`, also that the required ones are
    there, and the outputs' rows and shards."""
    for field, (kind, required) in _SHAPE.items():
        value: Any = manifest
        for key in field.split("."):
            value = value.get(key) if isinstance(value, dict) else None  # a parent may be missing
        _expect(field, value, kind, required and complete)
    if not complete:
        return
    for name, output in manifest["outputs"].items():
        _expect(f"outputs.{name}", output, dict, required=True)
        _expect(f"outputs.{name}.split", output.get("split"), str, required=True)
        _expect(f"outputs.{name}.rows", output.get("rows"), int, required=True)
        _expect(f"outputs.{name}.features", output.get("features"), dict, required=True)
        _expect(f"outputs.{name}.shards", output.get("shards"), list, required=True)
        for shard in output["shards"]:
            _expect(f"outputs.{name}.shards[]", shard, str, required=True)


def _expect(field: str, value: Any, kind: type, required: bool = False) -> None:
    """`value` (the manifest's `field`) is a `kind`, or missing (None) where it may be."""
    if value is None and not required:
        return
    if not isinstance(value, kind) or kind is int and isinstance(value, bool):
        raise TypeError(f"{field} is {type(value).__name__} {_shown(value)}, not {_JSON[kind]}")


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_image_stage(source: RenderingSource, config: dict[str, Any], outputs: dict[str, Any]) -> None:
    folder = source.folder
    _expect("config", config, dict, required=True)
    if config.get("stage") == "captions":
        raise UserFacingError(
            f"{folder} is a --stage captions build: its image stage has not run; draw its pairs "
            f"with `counterfactory build coco-counterfactuals --stage images --captions-from {folder} "
            "--generator G --output OUT` and combine those builds"
        )
    if config.get("image_import"):
        raise UserFacingError(
            f"{folder} imported its image pairs (--images-from): no generator drew them; "
            "combine builds whose images a --generator drew"
        )
    _check_shape(source.manifest, complete=False)
    images, generator = config.get("images") or {}, config.get("generator") or {}
    name = images.get("generator")
    if name not in GENERATORS or generator.get("name") != name:
        raise UserFacingError(
            f"{folder / MANIFEST} records no generator of this counterfactory "
            f"({', '.join(GENERATORS)}; got {name!r}); rebuild it with this version"
        )
    _check_shape(source.manifest, complete=True)
    if f"default/{config.get('split')}" not in outputs:
        raise UserFacingError(f"{folder} has no image pairs (no default/{config.get('split')} output): {_FINISH}")


def check_generators(sources: list[RenderingSource]) -> None:
    """One build per generator: a config per generator name."""
    seen: dict[str, RenderingSource] = {}
    for source in sources:
        first = seen.setdefault(source.generator, source)
        if first is not source:
            raise UserFacingError(
                f"{first.folder} and {source.folder} are both --generator {source.generator} builds; "
                "give one build per generator (its config is named after the generator)"
            )


def table_keys(source: RenderingSource) -> list[str]:
    """What identifies the caption-pair table a build drew: two builds draw the same table when
    they share a key. A caption stage is named by its source and the options that decide its pairs
    (`stage all`); a table read by `--stage images` by the digests of its files and how it was
    read, which a caption stage's own output (its `captions` shards) also matches."""
    cfg = source.config
    keys = []
    if cfg.get("stage") == "all":
        captions = {k: v for k, v in (cfg.get("captions") or {}).items() if k not in _HOW_NOT_WHAT}
        text_models = {r: cfg["models"].get(r) for r in ("mlm", "lm", "sentence")}
        stage = {
            **{k: cfg.get(k) for k in _CAPTION_SOURCE},
            "captions": captions,
            "models": text_models,
            "tagger": cfg.get("tagger"),
        }
        keys.append(_key("caption stage", stage))
        captions_out = source.output("captions") or {"shards": []}
        digests = [source.record(rel)["sha256"] for rel in captions_out["shards"]]
        reading = {k: None for k in _TABLE_READING} | {"allow_multiword_edits": False, "split": cfg.get("split")}
    else:
        digests = list((cfg.get("captions_table") or {}).get("files", {}).values())
        reading = {k: cfg.get(k) for k in _TABLE_READING}
    keys.append(_key("table", {"files": sorted(digests), "reading": reading}))
    return keys


def describe_table(source: RenderingSource) -> str:
    """The table a build drew, for an error line: its caption source or `--captions-from` table."""
    cfg = source.config
    if cfg.get("stage") == "all":
        where = cfg.get("coco_root") or cfg.get("dataset")
        return f"captions of {where} (max {cfg.get('max_captions') or 'all'}) by its caption stage"
    table = cfg.get("captions_table") or {}
    return f"--captions-from {table.get('repo') or table.get('path')}"


def check_same_table(sources: list[RenderingSource]) -> None:
    first, keys = sources[0], set(table_keys(sources[0]))
    for source in sources[1:]:
        if not keys & set(table_keys(source)):
            raise UserFacingError(
                f"{source.folder} draws another caption-pair table than {first.folder} "
                f"({describe_table(source)}, not {describe_table(first)}{_first_difference(first, source)}); "
                "combine builds of one table: the same caption source and caption options, or the "
                "same --captions-from table"
            )


def _first_difference(a: RenderingSource, b: RenderingSource) -> str:
    """`; --max-captions differs` for two caption stages, naming the first option that differs."""
    if a.config.get("stage") != "all" or b.config.get("stage") != "all":
        return ""
    for field in (*_CAPTION_SOURCE, "captions", "models", "tagger"):
        if a.config.get(field) != b.config.get(field):
            return f"; their {field} differs"
    return ""


def _key(kind: str, value: Any) -> str:
    return kind + ":" + json.dumps(value, sort_keys=True)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


# -- reading listed files ----------------------------------------------------------------------


def open_listed(folder: Path, rel: str) -> int:
    """A read descriptor of `folder/rel`, a regular file under the folder reached without following
    a symlink at any component below the folder (the folder itself is the user's and may be one)."""
    return open_no_follow(folder, rel, lambda: _not_regular(folder, rel))


def _listed_chunks(folder: Path, rel: str) -> Iterator[bytes]:
    fd = open_listed(folder, rel)
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(8 << 20):
            yield chunk


def _not_regular(folder: Path, rel: str) -> UserFacingError:
    return UserFacingError(
        f"{folder / rel} is a symlink or not a regular file; a build's files are read only inside "
        "its folder, never through a link — remove the link and re-run the build command"
    )


def check_listed_file(source: RenderingSource, rel: str) -> str:
    """The sha256 of the listed file `rel`, checked against the manifest (size and digest)."""
    record = source.record(rel)
    path = source.folder / rel
    try:
        fd = open_listed(source.folder, rel)
    except FileNotFoundError:
        raise UserFacingError(f"{path} is listed in {MANIFEST} but missing; re-run the build command") from None
    digest, size = hashlib.sha256(), 0
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(8 << 20):
            digest.update(chunk)
            size += len(chunk)
    if size != record.get("bytes") or digest.hexdigest() != record.get("sha256"):
        raise UserFacingError(
            f"{path} changed since the build (its size or sha256 differs from {MANIFEST}); "
            "re-run the build command to rebuild it"
        )
    return digest.hexdigest()
