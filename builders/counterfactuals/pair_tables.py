"""The image stage's caption pairs (`--captions-from`; builders/counterfactuals/METHOD.md §2,
"Caption pairs from elsewhere"): any table of (id, caption_0, caption_1), read into work items.

`resolve_table` says what `--captions-from` names, in this order:
- an existing `.tsv` file: the published COCO-Counterfactuals format `id<TAB>caption_0<TAB>caption_1`,
  with or without a header row (a first row holding the three column names is the header);
- an existing `.jsonl` file: one JSON object per line, by default the published keys
  `coco-counterfactual-index`, `original_caption`, `counterfactual_caption`;
- an existing folder with a `build_manifest.json`: a captions build of ours (its `captions` config);
- any other existing folder: a `datasets` table (parquet, csv, json, ...) with `caption_0` and
  `caption_1` columns (`id` too, else the row index is the id);
- else a Hub dataset id, at `--captions-revision`: downloaded once at its commit, then read as a
  folder. This goes through the `huggingface_hub` client, so `HF_ENDPOINT` and offline caches apply.
Column names are options (`--id-column --caption-0-column --caption-1-column`, defaults by format).

The path is the user's declared input and is resolved once; a table's cells are text and no path
in them is ever opened, and a folder's data files must lie inside it (`dataset_source`).
`PairTable.provenance` (path or repo + revision + commit, and the sha256 of each file read) goes
into the manifest and the card, where a local table is named as `provenance` names local things
(`local:NAME@sha256:...`), however its path was spelled (the builder's `local_inputs`).

Rows are read as a stream (`.tsv` / `.jsonl` line by line: `table_rows`). Every row is checked
(`pair_problem`): a missing or bad id (`table_rows.row_id`), a blank, non-text or too long caption,
identical captions, or an edit of more than one word (unless `allow_multiword_edits`) is an
`InputProblem`, a counted skip naming the table and row; the rest of the build goes on. Ids are
compared stripped: two rows with one id stop the build, naming both.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from builders.counterfactuals.caption_text import caption_tokens, changed_words, token_spans
from builders.counterfactuals.config import CocoCounterfactualsConfig
from builders.counterfactuals.schema import CAPTION_FEATURES
from builders.counterfactuals.table_rows import Record, jsonl_records, row_id, tsv_records
from builders.engine.dataset_source import local_data_files, no_dataset_scripts, open_split
from builders.engine.errors import InputFileError, InputProblem, UserFacingError
from builders.engine.sharding.build_files import file_sha256

#: Default (id, caption_0, caption_1) column names per table format.
DEFAULT_COLUMNS = {
    "build": ("id", "caption_0", "caption_1"),
    "datasets": ("id", "caption_0", "caption_1"),
    "tsv": ("id", "caption_0", "caption_1"),
    "jsonl": ("coco-counterfactual-index", "original_caption", "counterfactual_caption"),
}
#: A longer caption is `caption_too_long`. Stable Diffusion's and CLIP's text encoders see 77
#: tokens, about 300-400 characters of English (COCO captions average ~50), so nothing a model
#: could use is lost below 1,000, while the word comparison and the tokenizers stay cheap.
MAX_CAPTION_CHARS = 1_000
#: Rows of a `datasets` table read at a time.
_BATCH = 1_000
_FIX = (
    "give --captions-from a .tsv or .jsonl file, a dataset folder (or a captions build) or a Hub dataset id ORG/NAME"
)


@dataclass
class PairItem:
    """One caption pair: a work item of the images stage. `row` holds the `CAPTION_FEATURES`
    columns (those a table lacks are None); `id` is the table's own row id."""

    id: str | None
    row: dict[str, Any]
    #: Set for a row that cannot be drawn; the runner skips and counts it.
    input_problem: InputProblem | None = None


@dataclass(frozen=True)
class PairTable:
    """A resolved `--captions-from`: its format, the local file or folder read, its provenance."""

    format: str
    local: Path
    provenance: dict[str, Any]


def resolve_table(cfg: CocoCounterfactualsConfig) -> PairTable:
    """What `cfg.captions_from` names (module docstring), with the digests of its files."""
    given = cfg.captions_from
    path = Path(given).expanduser()
    if path.is_file():
        fmt = {".tsv": "tsv", ".jsonl": "jsonl"}.get(path.suffix.lower())
        if fmt is None:
            raise InputFileError(path, "is neither a .tsv nor a .jsonl file", _FIX)
        local = path.resolve()
        return PairTable(fmt, local, {"format": fmt, "path": str(local), "files": {local.name: file_sha256(local)}})
    if path.is_dir():
        local = path.resolve()
        fmt = "build" if (local / "build_manifest.json").is_file() else "datasets"
        files = _folder_digests(local, fmt, cfg.split, local)
        return PairTable(fmt, local, {"format": fmt, "path": str(local), "files": files})
    local, commit = _hub_snapshot(given, cfg.captions_revision)
    return PairTable(
        "datasets",
        local,
        {
            "format": "datasets",
            "repo": given,
            "revision": cfg.captions_revision,
            "commit": commit,
            "files": _folder_digests(local, "datasets", cfg.split, given),
        },
    )


def read_pairs(cfg: CocoCounterfactualsConfig, table: PairTable) -> Iterator[PairItem]:
    """Every row of the table as a `PairItem`, in table order, each checked by `pair_problem`:
    a stream, holding one line or batch of the table at a time (and the ids seen)."""
    defaults = DEFAULT_COLUMNS[table.format]
    columns = (cfg.id_column or defaults[0], cfg.caption_0_column or defaults[1], cfg.caption_1_column or defaults[2])
    if table.format == "tsv":
        records = tsv_records(table.local, columns, explicit=_explicit(cfg))
    elif table.format == "jsonl":
        records = jsonl_records(table.local, columns)
    else:
        records = _dataset_records(cfg, table, columns)
    source = table.provenance.get("repo") or table.local.name
    first: dict[str, str] = {}  # where each id was first seen
    for where, rec in records:
        if isinstance(rec, InputProblem):
            yield PairItem(None, {}, rec)
            continue
        item = _item(rec, source, where, cfg.allow_multiword_edits)
        if item.id is not None and first.setdefault(item.id, where) != where:
            raise UserFacingError(
                f"--captions-from: {first[item.id]} and {where} both have the id "
                f"{item.id!r} (ids are compared without surrounding spaces); "
                "give every row its own id"
            )
        yield item


def pair_problem(caption_0: object, caption_1: object, where: str, allow_multiword: bool) -> InputProblem | None:
    """Why a caption pair cannot be drawn, or None: a bad, blank or too long caption, no word
    changed, or (unless `allow_multiword`) more than one word changed (Prompt-to-Prompt's word
    swap assumes one)."""
    from loading_scripts.coco import caption_problem

    for text, name in ((caption_0, "caption_0"), (caption_1, "caption_1")):
        if not isinstance(text, str):  # (a short repr: the value may be a 1 MiB JSON array)
            return InputProblem("bad_caption", f"{where} ({name}) is {reprlib.repr(text)}, not a string")
        problem = caption_problem(text, f"{where} ({name})")
        if problem is not None:
            return problem
        if len(text) > MAX_CAPTION_CHARS:
            return InputProblem(
                "caption_too_long",
                f"{where} ({name}) has {len(text):,} characters (captions have at most {MAX_CAPTION_CHARS:,})",
            )
    changed = changed_words(caption_0, caption_1)
    if changed == []:
        return InputProblem("identical_captions", f"{where}: caption_0 and caption_1 have the same words")
    if not allow_multiword and (changed is None or len(changed) > 1):
        what = "a different number of words" if changed is None else f"{len(changed)} changed words"
        return InputProblem(
            "not_one_word_edit",
            f"{where}: the captions differ by {what}; pass --allow-multiword-edits to draw such pairs anyway",
        )
    return None


def _item(rec: dict[str, Any], source: str, where: str, allow_multiword: bool) -> PairItem:
    """A `PairItem` of one table row: a build's row as it is, another table's row with its
    source. A row that cannot be drawn keeps only its id and problem (the runner skips it)."""
    row_id_ = row_id(rec.get("id"), where)
    if isinstance(row_id_, InputProblem):
        return PairItem(None, {}, row_id_)
    problem = (
        InputProblem("missing_id", f"{where} has no id")
        if row_id_ is None
        else pair_problem(rec["caption_0"], rec["caption_1"], where, allow_multiword)
    )
    if problem is not None:
        return PairItem(row_id_, {}, problem)
    if "source" in rec:  # a captions build's row: every column is there
        return PairItem(row_id_, dict(rec, id=row_id_))
    row = {**dict.fromkeys(CAPTION_FEATURES), **rec, "id": row_id_, "source": source, "source_id": row_id_}
    row.update(_swap_columns(rec["caption_0"], rec["caption_1"]))
    return PairItem(row_id_, row)


def _swap_columns(caption_0: object, caption_1: object) -> dict[str, Any]:
    """`replaced_word`, `replacement_word`, `replaced_position` of a one-word edit made in place
    (the two captions equal outside the word, as the schema says); empty for any other pair."""
    if not (isinstance(caption_0, str) and isinstance(caption_1, str)):
        return {}
    changed = changed_words(caption_0, caption_1)
    if not changed or len(changed) != 1:
        return {}
    i, t0, t1 = changed[0], caption_tokens(caption_0), caption_tokens(caption_1)
    s0, s1 = token_spans(caption_0, t0), token_spans(caption_1, t1)
    if s0 is None or s1 is None or s0[i][0] != s1[i][0]:
        return {}
    (a, b), (_, d) = s0[i], s1[i]
    old, new = caption_0[a:b], caption_1[a:d]
    if caption_0[:a] + caption_0[b:] != caption_1[:a] + caption_1[d:]:
        return {}
    return {"replaced_word": old, "replacement_word": new, "replaced_position": a}


def _explicit(cfg: CocoCounterfactualsConfig) -> bool:
    return any((cfg.id_column, cfg.caption_0_column, cfg.caption_1_column))


def _dataset_records(
    cfg: CocoCounterfactualsConfig, table: PairTable, columns: tuple[str, str, str]
) -> Iterator[Record]:
    name = str(table.provenance.get("repo") or table.local)
    label = table.provenance.get("repo") or table.local.name  # how per-row messages name it
    if table.format == "build":
        ds = open_split(
            str(table.local),
            "captions",
            cfg.split,
            flag="--captions-from",
            cannot_load=_cannot_load(table.local, "build", cfg.split),
        )
        missing = set(CAPTION_FEATURES) - set(ds.column_names)
        if missing:
            raise InputFileError(
                table.local,
                f"caption pairs lack columns {sorted(missing)}",
                "use a coco-counterfactuals captions build",
            )
        rows = (row for batch in _batches(ds) for row in batch.to_pylist())
        yield from ((f"{label} row {n}", rec) for n, rec in enumerate(rows))
        return
    ds = _one_split(cfg, table, name)
    id_col = columns[0] if (cfg.id_column or columns[0] in ds.column_names) else None
    missing = [c for c in (id_col, *columns[1:]) if c and c not in ds.column_names]
    if missing:
        raise InputFileError(
            name,
            f"has no column(s) {missing} (columns: {ds.column_names})",
            "name them with --id-column / --caption-0-column / --caption-1-column",
        )
    # As stored (Arrow, never decoded), so no path in a cell is opened.
    n = 0
    for batch in _batches(ds):
        ids = batch.column(id_col).to_pylist() if id_col else range(n, n + batch.num_rows)
        texts = zip(ids, batch.column(columns[1]).to_pylist(), batch.column(columns[2]).to_pylist(), strict=True)
        for values in texts:
            yield f"{label} row {n}", dict(zip(("id", "caption_0", "caption_1"), values, strict=True))
            n += 1


def _batches(ds):
    """The split's rows as Arrow tables of `_BATCH` rows, as stored (nothing decoded)."""
    return ds.with_format("arrow").iter(batch_size=_BATCH)


def _one_split(cfg: CocoCounterfactualsConfig, table: PairTable, name: str):
    splits = open_split(
        str(table.local), None, None, flag="--captions-from", cannot_load=_cannot_load(name, "datasets", cfg.split)
    )
    choice = cfg.captions_split or (next(iter(splits)) if len(splits) == 1 else None)
    if choice not in splits:
        raise InputFileError(name, f"has the splits {', '.join(splits)}", "pick one with --captions-split NAME")
    return splits[choice]


def _cannot_load(name: object, fmt: str, split: str) -> Callable[[Exception], InputFileError]:
    """The one line for a folder `datasets` cannot read (`open_split`'s `cannot_load`)."""
    if fmt == "build":
        return lambda err: InputFileError(
            name, f"holds no `captions` config with a {split!r} split ({err})", "build it with --stage captions first"
        )
    return lambda err: InputFileError(name, f"cannot be read as a `datasets` table ({err})", _FIX)


def _folder_digests(folder: Path, fmt: str, split: str, name: object) -> dict[str, str]:
    """sha256 of each data file `datasets` reads from a dataset folder (of a build, of its
    `captions` config: its image shards are not read), named relative to the folder. A data
    file outside the folder is refused here, before anything is read (`local_data_files`)."""
    with no_dataset_scripts(str(folder), "--captions-from"):
        try:
            files = local_data_files(str(folder), "captions" if fmt == "build" else None) or {}
        except InputFileError:
            raise
        except (FileNotFoundError, ValueError) as err:
            raise _cannot_load(name, fmt, split)(err) from None
    return {p.relative_to(folder).as_posix(): file_sha256(p) for paths in files.values() for p in sorted(paths)}


def _hub_snapshot(repo: str, revision: str | None) -> tuple[Path, str]:
    """The Hub dataset `repo` at `revision`, downloaded at its commit: (local folder, commit)."""
    import httpx2
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        commit = HfApi().dataset_info(repo, revision=revision).sha
        return Path(snapshot_download(repo, repo_type="dataset", revision=commit)), commit
    # The client's transport errors are `httpx2`'s, not the built-in ConnectionError.
    except (HfHubHTTPError, httpx2.TransportError, OSError, ValueError) as err:
        raise InputFileError(
            repo,
            f"is no file or folder here and no readable Hub dataset "
            f"({type(err).__name__}: {str(err).splitlines()[0]})",
            _FIX,
        ) from None
