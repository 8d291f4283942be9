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
in them is ever opened. `PairTable.provenance` (path or repo + revision + commit, and the sha256 of
each file read) goes into the manifest and the card.

Every row is checked (`pair_problem`): a missing id, a blank or non-text caption, identical
captions, or an edit of more than one word (unless `allow_multiword_edits`) is an `InputProblem`,
a counted skip naming the table and row; the rest of the build goes on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builders.counterfactuals.captions import changed_words
from builders.counterfactuals.config import CocoCounterfactualsConfig
from builders.counterfactuals.schema import CAPTION_FEATURES
from builders.engine.dataset_source import open_split, stored_values
from builders.engine.errors import InputFileError, InputProblem
from builders.engine.sharding.build_files import file_sha256

#: Default (id, caption_0, caption_1) column names per table format.
DEFAULT_COLUMNS = {
    "build": ("id", "caption_0", "caption_1"),
    "datasets": ("id", "caption_0", "caption_1"),
    "tsv": ("id", "caption_0", "caption_1"),
    "jsonl": ("coco-counterfactual-index", "original_caption", "counterfactual_caption"),
}
#: Files of a dataset folder that `datasets` reads as data (the ones whose digest is recorded).
_DATA_SUFFIXES = (".parquet", ".arrow", ".csv", ".tsv", ".json", ".jsonl", ".txt")
_FIX = ("give --captions-from a .tsv or .jsonl file, a dataset folder (or a captions build) or a "
        "Hub dataset id ORG/NAME")


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
        return PairTable(fmt, local, {"format": fmt, "path": str(local),
                                      "files": {local.name: file_sha256(local)}})
    if path.is_dir():
        local = path.resolve()
        fmt = "build" if (local / "build_manifest.json").is_file() else "datasets"
        return PairTable(fmt, local, {"format": fmt, "path": str(local),
                                      "files": _folder_digests(local, fmt, cfg.split)})
    local, commit = _hub_snapshot(given, cfg.captions_revision)
    return PairTable("datasets", local, {"format": "datasets", "repo": given,
                                         "revision": cfg.captions_revision, "commit": commit,
                                         "files": _folder_digests(local, "datasets", cfg.split)})


def read_pairs(cfg: CocoCounterfactualsConfig, table: PairTable) -> list[PairItem]:
    """Every row of the table as a `PairItem`, in table order, each checked by `pair_problem`."""
    defaults = DEFAULT_COLUMNS[table.format]
    columns = (cfg.id_column or defaults[0], cfg.caption_0_column or defaults[1],
               cfg.caption_1_column or defaults[2])
    if table.format == "tsv":
        records = _tsv_records(table.local, columns, explicit=_explicit(cfg))
    elif table.format == "jsonl":
        records = _jsonl_records(table.local, columns)
    else:
        records = _dataset_records(cfg, table, columns)
    source = table.provenance.get("repo") or table.local.name
    items = []
    for where, rec in records:
        if isinstance(rec, InputProblem):
            items.append(PairItem(None, {}, rec))
            continue
        items.append(_item(rec, source, where, cfg.allow_multiword_edits))
    return items


def pair_problem(caption_0: object, caption_1: object, where: str,
                 allow_multiword: bool) -> InputProblem | None:
    """Why a caption pair cannot be drawn, or None: a bad or blank caption, no word changed, or
    (unless `allow_multiword`) more than one word changed (Prompt-to-Prompt's word swap assumes one)."""
    from loading_scripts.coco import caption_problem

    for text, name in ((caption_0, "caption_0"), (caption_1, "caption_1")):
        problem = caption_problem(text, f"{where} ({name})")
        if problem is not None:
            return problem
    changed = changed_words(caption_0, caption_1)
    if changed == []:
        return InputProblem("identical_captions", f"{where}: caption_0 and caption_1 have the same words")
    if not allow_multiword and (changed is None or len(changed) > 1):
        what = "a different number of words" if changed is None else f"{len(changed)} changed words"
        return InputProblem("not_one_word_edit", f"{where}: the captions differ by {what}; "
                            "pass --allow-multiword-edits to draw such pairs anyway")
    return None


def _item(rec: dict[str, Any], source: str, where: str, allow_multiword: bool) -> PairItem:
    """A `PairItem` of one table row: a build's row as it is, another table's row with its source."""
    raw_id = rec.get("id")
    row_id = None if raw_id is None or not str(raw_id).strip() else str(raw_id)
    if "source" in rec:  # a captions build's row: every column is there
        row = dict(rec, id=row_id)
    else:
        row = {**dict.fromkeys(CAPTION_FEATURES), **rec, "id": row_id, "source": source,
               "source_id": row_id}
        row.update(_swap_columns(rec["caption_0"], rec["caption_1"]))
    problem = InputProblem("missing_id", f"{where} has no id") if row_id is None else \
        pair_problem(rec["caption_0"], rec["caption_1"], where, allow_multiword)
    return PairItem(row_id, row, problem)


def _swap_columns(caption_0: object, caption_1: object) -> dict[str, Any]:
    """`replaced_word`, `replacement_word`, `replaced_position` of a one-word edit made in place
    (the two captions equal outside the word, as the schema says); empty for any other pair."""
    from builders.counterfactuals.captions import caption_tokens, token_spans

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


def _record(values: tuple[Any, Any, Any]) -> dict[str, Any]:
    return dict(zip(("id", "caption_0", "caption_1"), values))


def _tsv_records(path: Path, columns: tuple[str, str, str], explicit: bool) -> list[tuple[str, Any]]:
    """(where, record or problem) per data line. A first line holding the three column names is
    the header; without one the columns are id, caption_0, caption_1 in that order."""
    lines = _text(path).splitlines()
    first = lines[0].split("\t") if lines else []
    if all(c in first for c in columns):
        index, width, start = tuple(first.index(c) for c in columns), len(first), 1
    elif explicit:
        raise InputFileError(path, f"has no header row naming the columns {list(columns)} "
                             f"(first row: {first})", "add the header, or leave out the column "
                             "options for a headerless id<TAB>caption_0<TAB>caption_1 file")
    else:
        index, width, start = (0, 1, 2), 3, 0
    out: list[tuple[str, Any]] = []
    for n, line in enumerate(lines[start:], start=start + 1):
        where = f"{path.name} line {n}"
        fields = line.split("\t")
        if len(fields) != width:
            out.append((where, InputProblem("bad_row", f"{where} has {len(fields)} tab-separated "
                                            f"fields, not {width}")))
            continue
        out.append((where, _record(tuple(fields[k] for k in index))))
    return out


def _jsonl_records(path: Path, columns: tuple[str, str, str]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for n, line in enumerate(_text(path).splitlines(), start=1):
        where = f"{path.name} line {n}"
        try:
            obj = json.loads(line)
        except ValueError as err:
            out.append((where, InputProblem("bad_row", f"{where} is not JSON ({err})")))
            continue
        if not isinstance(obj, dict):
            out.append((where, InputProblem("bad_row", f"{where} is not a JSON object")))
            continue
        seen.update(obj)
        out.append((where, _record(tuple(obj.get(c) for c in columns))))
    missing = [c for c in columns if c not in seen]
    if out and missing:
        raise InputFileError(path, f"has no key(s) {missing} on any line (keys: {sorted(seen)})",
                             "name them with --id-column / --caption-0-column / --caption-1-column")
    return out


def _dataset_records(cfg: CocoCounterfactualsConfig, table: PairTable,
                     columns: tuple[str, str, str]) -> list[tuple[str, Any]]:
    name = str(table.provenance.get("repo") or table.local)
    label = table.provenance.get("repo") or table.local.name  # how per-row messages name it
    if table.format == "build":
        ds = open_split(str(table.local), "captions", cfg.split, flag="--captions-from",
                        cannot_load=lambda err: InputFileError(
                            table.local, f"holds no `captions` config with a {cfg.split!r} split "
                            f"({err})", "build it with --stage captions first"))
        missing = set(CAPTION_FEATURES) - set(ds.column_names)
        if missing:
            raise InputFileError(table.local, f"caption pairs lack columns {sorted(missing)}",
                                 "use a coco-counterfactuals captions build")
        return [(f"{label} row {n}", rec) for n, rec in enumerate(ds.to_list())]
    ds = _one_split(cfg, table, name)
    id_col = columns[0] if (cfg.id_column or columns[0] in ds.column_names) else None
    missing = [c for c in (id_col, *columns[1:]) if c and c not in ds.column_names]
    if missing:
        raise InputFileError(name, f"has no column(s) {missing} (columns: {ds.column_names})",
                             "name them with --id-column / --caption-0-column / --caption-1-column")
    # As stored: never decoded, so no path in a cell is opened.
    ids = stored_values(ds, id_col) if id_col else list(range(len(ds)))
    texts = zip(ids, stored_values(ds, columns[1]), stored_values(ds, columns[2]))
    return [(f"{label} row {n}", _record(v)) for n, v in enumerate(texts)]


def _one_split(cfg: CocoCounterfactualsConfig, table: PairTable, name: str):
    splits = open_split(str(table.local), None, None, flag="--captions-from",
                        cannot_load=lambda err: InputFileError(name, f"cannot be read as a "
                                                               f"`datasets` table ({err})", _FIX))
    choice = cfg.captions_split or (next(iter(splits)) if len(splits) == 1 else None)
    if choice not in splits:
        raise InputFileError(name, f"has the splits {', '.join(splits)}",
                             "pick one with --captions-split NAME")
    return splits[choice]


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputFileError(path, f"is not UTF-8 text ({err.reason} at byte {err.start})",
                             "save the table as UTF-8") from None


def _folder_digests(folder: Path, fmt: str, split: str) -> dict[str, str]:
    """sha256 of each data file of a dataset folder; of a build, only its caption pairs' shards
    (its image shards are not read)."""
    if fmt == "build":
        files = sorted((folder / "data" / "captions").glob(f"{split}-*.parquet"))
    else:
        files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in _DATA_SUFFIXES
                       and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    return {p.relative_to(folder).as_posix(): file_sha256(p) for p in files}


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
        raise InputFileError(repo, f"is no file or folder here and no readable Hub dataset "
                             f"({type(err).__name__}: {str(err).splitlines()[0]})", _FIX) from None
