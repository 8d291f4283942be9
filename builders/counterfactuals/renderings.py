"""One caption-pair table rendered by several generators, as one dataset with a config per generator
(`counterfactory renderings --output OUT BUILD BUILD [...]`; issue #37 §2).

Each generator's rows come from its own finished coco-counterfactuals build (`--generator G`; each
stays resumable and may run on its own machine), checked by `rendering_sources`. The combined
folder is a build like any other, which `counterfactory publish` and `counterfactory show --config
G` take unchanged:

    OUT/data/<G>/<split>-NNNNN-of-NNNNN.parquet   generator G's rows (its build's `default` config)
    OUT/data/captions/<split>-*.parquet           the caption-pair table, when a build has it
    OUT/figures/<G>/examples.png                  each build's example grid, for the card
    OUT/README.md                                 `configs:` G1 (the default), G2, ..., captions
    OUT/build_manifest.json                       `files`, and `renderings`: per generator its
                                                  rows, pairs in, filter counts, model and source

Shards are hard-linked when the builds are on the same file system, else copied a chunk at a
time; the rows are checked a row group at a time, reading the id, caption and generator columns
only (never the images). Every row's `generator` is its config's name, and a pair id names the same
caption pair in every config: the check keeps a 16-byte digest of each id's captions, so memory
grows with the pair ids (a few MB for the 25,014 captions of COCO val2017), never with the images.
Everything is checked before the first file is written: a refused set of builds leaves OUT as it
was.
"""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builders import __version__
from builders.counterfactuals.config import IMAGE_FILTERS
from builders.counterfactuals.rendering_sources import (
    RenderingSource,
    check_generators,
    check_listed_file,
    check_same_table,
    open_listed,
    read_source,
)
from builders.engine.errors import UserFacingError
from builders.engine.no_follow import RootDir
from builders.engine.provenance import git_state
from builders.engine.sharding.build_records import add_pending, check_discardable, discard_build, write_card
from builders.engine.sharding.layout import OutputLayout
from builders.engine.sharding.merge import package_versions, write_manifest
from builders.engine.sharding.output_guard import output_errors, output_lock

log = logging.getLogger(__name__)

#: The normal quantile of a two-sided 95 % interval.
_Z95 = 1.959963984540054
#: Row-check columns: what a pair is (id and captions) and who drew it.
_PAIR_COLUMNS = ("id", "caption_0", "caption_1")
_EXAMPLES = "figures/examples.png"
_SUMMARY = (
    "Counterfactual image-text pairs: each original COCO caption gets a counterfactual caption with one "
    "noun swapped, and each of several image generators draws a pair of images that differ only where "
    "the captions differ."
)


@dataclass(frozen=True)
class RenderingsConfig:
    """Example: `RenderingsConfig((Path("out/cf-sd15"), Path("out/cf-flux")), Path("out/cf"))`:
    configs `sd15` (the default) and `flux`, in the order given."""

    builds: tuple[Path, ...]
    output: Path
    #: Replace the build in `output` (refused when it holds files that are not a build's).
    overwrite: bool = False


@dataclass(frozen=True)
class RenderingsResult:
    output: Path
    #: Rows per generator, in the order given.
    rows: dict[str, int]
    #: Pair ids every generator kept: the set a comparison between generators is paired on.
    common_pairs: int


@dataclass(frozen=True)
class _Copy:
    """A listed file of a source build and where it goes in OUT, with its checked sha256."""

    source: RenderingSource
    rel: str
    dest: str
    sha256: str


def wilson_interval(kept: int, total: int) -> list[float] | None:
    """The Wilson score 95 % interval of the proportion kept/total (None when total is 0): unlike
    the normal approximation it stays inside [0, 1] and is not empty at 0 or total."""
    if total <= 0:
        return None
    p, z2 = kept / total, _Z95 * _Z95
    centre = (p + z2 / (2 * total)) / (1 + z2 / total)
    half = _Z95 * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total)) / (1 + z2 / total)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def combine(cfg: RenderingsConfig) -> RenderingsResult:
    """Check the builds and OUT (module docstring), then write OUT."""
    if len(cfg.builds) < 2:
        given = ", ".join(str(b) for b in cfg.builds) or "none"
        raise UserFacingError(
            f"renderings combines at least 2 builds, one per generator (got {given}); give the "
            "--output folders of `counterfactory build coco-counterfactuals --generator G` runs"
        )
    sources = [read_source(Path(build)) for build in cfg.builds]
    check_generators(sources)
    check_same_table(sources)
    # OUT is opened once, at its first use; every write and delete below it goes through it.
    with OutputLayout(Path(cfg.output)) as layout:
        _check_output(layout, sources, cfg.overwrite)
        copies = _plan(sources)
        pairs = _check_pairs(sources, _captions_source(sources))
        manifest = _manifest(sources, copies, pairs, cfg)
        with output_errors(layout.root):
            layout.root.mkdir(parents=True, exist_ok=True)
            with output_lock(layout):
                if cfg.overwrite:
                    discard_build(layout)
                add_pending(layout, manifest["files"])  # a kill while copying leaves them the build's
                for copy in copies:
                    _place(copy, layout.out)
                _write_card_and_manifest(layout, manifest)
    rows = {s.generator: manifest["renderings"][s.generator]["rows"] for s in sources}
    return RenderingsResult(Path(cfg.output), rows, pairs.common)


def _check_output(layout: OutputLayout, sources: list[RenderingSource], overwrite: bool) -> None:
    root = layout.root
    if root.exists() and not root.is_dir():
        raise UserFacingError(f"--output {root} is a file; choose a folder (or a path that does not exist yet)")
    out = root.resolve()
    for source in sources:
        folder = source.folder.resolve()
        if out == folder or folder in out.parents or out in folder.parents:
            raise UserFacingError(
                f"--output {root} overlaps the build {source.folder}; write the combined dataset to a folder of its own"
            )
    found = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    if found and not overwrite:
        raise UserFacingError(
            f"--output {root} is not empty; choose a new folder, or add --overwrite to replace the build it holds"
        )
    if found:
        # --overwrite replaces a build, finished or interrupted, and only its own files: a folder
        # holding no build, or a file no record lists, is refused before anything is written.
        check_discardable(layout)


def _captions_source(sources: list[RenderingSource]) -> RenderingSource | None:
    """The first build holding the caption-pair table (a `--stage all` build's `captions`)."""
    return next((s for s in sources if (s.output("captions") or {}).get("rows")), None)


def _plan(sources: list[RenderingSource]) -> list[_Copy]:
    """Every file OUT gets from the builds, each checked against its build's manifest."""
    plan = []
    for source in sources:
        for rel in source.output("default")["shards"]:
            plan.append(_Copy(source, rel, f"data/{source.generator}/{Path(rel).name}", ""))
        if any(f.get("path") == _EXAMPLES for f in source.manifest.get("card_figures") or []):
            plan.append(_Copy(source, _EXAMPLES, f"figures/{source.generator}/examples.png", ""))
    captions = _captions_source(sources)
    if captions is not None:
        plan += [_Copy(captions, rel, rel, "") for rel in captions.output("captions")["shards"]]
    return [_Copy(c.source, c.rel, c.dest, check_listed_file(c.source, c.rel)) for c in plan]


@dataclass(frozen=True)
class _Pairs:
    #: Rows read per generator.
    rows: dict[str, int]
    #: Pair ids any generator kept, and those every generator that kept any kept.
    ids: int
    common: int


def _check_pairs(sources: list[RenderingSource], captions: RenderingSource | None) -> _Pairs:
    """Read every row's id, captions and generator, a row group at a time (module docstring)."""
    seen: dict[str, tuple[bytes, int, int]] = {}  # id -> (captions digest, first source, generators)
    rows: dict[str, int] = {}
    tables = [(i, s, "default") for i, s in enumerate(sources)]
    if captions is not None:
        tables.append((sources.index(captions), captions, "captions"))
    for index, source, config in tables:
        n = 0
        bit = 1 << index if config == "default" else 0
        for rel in source.output(config)["shards"]:
            for pair_id, digest, generator in _pair_rows(source, rel, with_generator=bool(bit)):
                n += 1
                where = f"{source.folder / rel}, id {pair_id!r}"
                if bit and generator != source.generator:
                    raise UserFacingError(
                        f"{where}: the row's generator is {generator!r}, not the build's "
                        f"{source.generator!r}; the shard is not this build's — re-run its build command"
                    )
                first = seen.setdefault(pair_id, (digest, index, 0))
                if first[0] != digest:
                    raise UserFacingError(
                        f"{where}: the pair has other captions than in {sources[first[1]].folder}; the "
                        "builds drew different caption-pair tables — combine builds of one table"
                    )
                if first[2] & bit:
                    raise UserFacingError(
                        f"{where}: the id appears twice; re-run the build command of {source.folder}"
                    )
                seen[pair_id] = (digest, first[1], first[2] | bit)
        if n != source.output(config)["rows"]:
            raise UserFacingError(
                f"{source.folder}: its {config} shards hold {n} rows, its manifest says "
                f"{source.output(config)['rows']}; re-run the build command"
            )
        if config == "default":
            rows[source.generator] = n
    # A generator that kept no pair has no config (an empty output is not published), so it can
    # be compared on nothing: "every generator" is every generator with rows, as the benchmark
    # reading the published configs sees them; the card names the others.
    every = sum(1 << i for i, s in enumerate(sources) if rows[s.generator])
    kept = [mask for _, _, mask in seen.values() if mask]
    return _Pairs(rows, len(kept), sum(mask == every for mask in kept) if every else 0)


def _pair_rows(source: RenderingSource, rel: str, with_generator: bool):
    """(id, digest of its captions, generator) of each row of a listed shard, a row group at a time."""
    import pyarrow.parquet as pq

    columns = [*_PAIR_COLUMNS, *(["generator"] if with_generator else [])]
    with os.fdopen(open_listed(source.folder, rel), "rb") as fh:
        parquet = pq.ParquetFile(fh)
        missing = [c for c in columns if c not in parquet.schema_arrow.names]
        if missing:
            raise UserFacingError(
                f"{source.folder / rel} has no {', '.join(missing)} column; not a coco-counterfactuals "
                "shard — re-run the build command"
            )
        for group in range(parquet.num_row_groups):
            batch = parquet.read_row_group(group, columns=columns).to_pydict()
            for i, pair_id in enumerate(batch["id"]):
                text = f"{batch['caption_0'][i]}\0{batch['caption_1'][i]}".encode()
                digest = hashlib.blake2b(text, digest_size=16).digest()
                yield pair_id, digest, batch["generator"][i] if with_generator else None


def _place(copy: _Copy, out: RootDir) -> None:
    """Hard-link the checked file (the very inode that was checked), else copy it a chunk at a
    time; in OUT, relative to its descriptor (a linked folder there is refused, never written into)."""
    fd = open_listed(copy.source.folder, copy.rel)
    with os.fdopen(fd, "rb") as fh, out.parent(copy.dest, create=True) as (folder, name):
        checked = os.fstat(fh.fileno())
        try:
            os.link(copy.source.folder / copy.rel, name, dst_dir_fd=folder, follow_symlinks=False)
        except OSError as err:
            if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP):
                raise
        else:
            linked = os.stat(name, dir_fd=folder, follow_symlinks=False)
            if (linked.st_dev, linked.st_ino) == (checked.st_dev, checked.st_ino):
                return
            os.unlink(name, dir_fd=folder)  # the path was replaced since it was checked: copy what was opened
        digest = hashlib.sha256()
        tmp = name + ".tmp"
        with os.fdopen(
            os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666, dir_fd=folder), "wb"
        ) as dest:
            while chunk := fh.read(8 << 20):
                digest.update(chunk)
                dest.write(chunk)
        if digest.hexdigest() != copy.sha256:
            os.unlink(tmp, dir_fd=folder)
            raise UserFacingError(f"{copy.source.folder / copy.rel} changed while it was copied; re-run")
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)


def _write_card_and_manifest(layout: OutputLayout, manifest: dict[str, Any]) -> None:
    from builders.publishing.card import render_card

    write_card(layout, manifest, render_card(manifest))
    write_manifest(layout, manifest)  # last: its presence marks a finished build


def _manifest(sources: list[RenderingSource], copies: list[_Copy], pairs: _Pairs, cfg: RenderingsConfig) -> dict:
    """OUT's manifest: a build's (outputs, files, card fields) plus `renderings` per generator."""
    first, split = sources[0], sources[0].split
    outputs = {}
    for source in sources:
        out = source.output("default")
        outputs[f"{source.generator}/{split}"] = {
            **out,
            "config": source.generator,
            "data_dir": f"data/{source.generator}",
            "shards": [c.dest for c in copies if c.source is source and c.rel in out["shards"]],
        }
    captions = _captions_source(sources)
    if captions is not None:
        outputs[f"captions/{split}"] = captions.output("captions")
    fields = first.manifest.get("card_fields") or {}
    command = ["counterfactory", "renderings", "--output", _output_name(cfg.output), *(s.name for s in sources)]
    return {
        "builder": "coco-counterfactuals-renderings",
        "card_template": "coco_counterfactuals_renderings.md",
        "pretty_name": first.manifest.get("pretty_name", "COCO-Counterfactuals"),
        "config": {"generators": [s.generator for s in sources], "split": split, "sources": [s.name for s in sources]},
        "models": {s.generator: s.manifest["models"].get("sd") for s in sources},
        "card_fields": {**fields, "summary": _SUMMARY, "tags": [*fields.get("tags", []), "generator-comparison"]},
        "counterfactory_version": __version__,
        "counterfactory_git": git_state(),
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command + (["--overwrite"] if cfg.overwrite else []),
        "packages": package_versions(),
        "items": pairs.ids,
        "outputs": outputs,
        "skipped": {},
        "errors": {},
        "counts": {},
        "renderings": {s.generator: _rendering(s, pairs.rows[s.generator]) for s in sources},
        "common_pairs": pairs.common,
        "without_pairs": [s.generator for s in sources if not pairs.rows[s.generator]],
        "card_figures": [
            {"path": c.dest, "alt": f"{c.source.generator}: the first rows of {c.source.generator}/{split}"}
            for c in copies
            if c.rel == _EXAMPLES
        ],
        "files": [
            {"path": c.dest, "bytes": c.source.record(c.rel)["bytes"], "sha256": c.sha256}
            for c in sorted(copies, key=lambda c: c.dest)
        ],
    }


def _output_name(output: Path) -> str:
    """OUT as the manifest names it: its folder name (never the machine's path to it)."""
    return Path(os.path.abspath(output)).name


def _rendering(source: RenderingSource, rows: int) -> dict[str, Any]:
    """A generator's record: what the card's table shows and the benchmark reads."""
    cfg, counts = source.config, source.manifest.get("counts") or {}
    skipped = source.image_skips()
    pairs_in = rows + sum(skipped.values())
    tried = int(counts.get("image_candidates_tried") or 0)
    applied = cfg["images"].get("filters") or IMAGE_FILTERS
    pass_rates = {
        name: (tried - int(counts.get(f"image_rejected_{name}") or 0)) / tried if tried and name in applied else None
        for name in IMAGE_FILTERS
    }
    pass_rates["all"] = int(counts.get("image_candidates_passed") or 0) / tried if tried else None
    return {
        "generator": source.generator,
        "rows": rows,
        "pairs_in": pairs_in,
        "kept_ci95": wilson_interval(rows, pairs_in),
        "counts": counts,
        "skipped": skipped,
        "pass_rates": pass_rates,
        "model": source.manifest["models"].get("sd"),
        "method": cfg["generator"]["method"],
        "license": cfg["generator"]["license"],
        "default_model": cfg["generator"]["default_model"],
        "steps": cfg["images"]["steps"],
        "guidance_range": cfg["images"]["guidance_range"],
        # The model's reference settings (#43); older builds did not record them.
        "reference": cfg["generator"].get("reference"),
        "resolution": cfg["images"]["image_size"],
        "source": source.name,
        "source_created_at": source.manifest.get("created_at"),
        "source_counterfactory_git": source.manifest.get("counterfactory_git"),
        "config": cfg,
    }


def main_summary(result: RenderingsResult) -> str:
    """The command's closing line."""
    rows = ", ".join(f"{g} {n}" for g, n in result.rows.items())
    return (
        f"wrote {result.output} ({rows} rows; {result.common_pairs} pairs kept by every generator): "
        f"publish it with `counterfactory publish {result.output} --repo-id ORG/NAME --version vX.Y.Z`"
    )
