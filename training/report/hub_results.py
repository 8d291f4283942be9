"""`counterfactory benchmark --push-to-hub ORG/NAME`: append the records to a results dataset on
the Hub that `load_dataset("ORG/NAME")` reads without a script (parquet under data/, README.md
YAML `configs:`), with a card rendering the comparison table of every row in the repo.

One row per record; `metrics` and its per-metric fields (`ci_low`, `ci_high`, `n_units`,
`n_clusters`, `ci_method`, `trivial`, `ci_note`, `chance`: training/report/results.py) are JSON
strings keyed by metric (every task names other metrics, and one column type lets every push's
file share one schema).
A record is identified by `KEY_FIELDS` (its metric module's file digest and the code version
among them): pushing a record already there adds nothing (no commit when nothing is new), a new
model adds only its rows, each push as its own parquet file, so earlier rows are never rewritten.
Files pushed by an earlier version (`PAST_COLUMNS`: before the intervals, before their clusters
and methods) still load: their rows are read with the missing columns null, and the push that
adds the first new file rewrites them with `COLUMNS` (values unchanged, the new columns null), so
`load_dataset` reads one schema."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math

from builders.engine.errors import PublishError
from builders.publishing.hub_client import check_repo_id, hub_errors, retrying, use_endpoint
from training.report.markdown import BLIND, SMALL_SAMPLE, blind_lines, comparison_table, plain
from training.report.results import INTERVAL_FIELDS

log = logging.getLogger(__name__)

KEY_FIELDS = (
    "model",
    "weights_digest",
    "dataset",
    "dataset_source",
    "dataset_commit",
    "task",
    "metric",
    "metric_version",
    "code_version",
    "bootstrap",
    "seed",
)
#: The columns of the files pushed before the intervals: still read.
OLD_COLUMNS = (
    "dataset",
    "model",
    "pretrained",
    "backend",
    "weights_digest",
    "task",
    "metrics",
    "dataset_source",
    "dataset_revision",
    "dataset_commit",
    "metric",
    "metric_version",
    "code_version",
    "key",
)
#: The records' per-metric fields (JSON objects keyed by metric name) -> the type of their
#: values. A field added to the records adds a column: add the columns before it to PAST_COLUMNS.
PER_METRIC = {
    f: {"ci_method": "string", "ci_note": "string", "trivial": "boolean"}.get(f, "number") for f in INTERVAL_FIELDS
}
#: The columns of every earlier version's files, oldest first: before the intervals, then before
#: each interval's clusters, method, note and chance level (#42), then before the ITM records
#: said which G they used (`g_kind`, #51), how a cross-encoder ranked, and PN's s. Still read,
#: and rewritten.
_BEFORE_G_KIND = (
    *OLD_COLUMNS[:7],
    "language",
    *(f for f in PER_METRIC if f != "metrics"),
    "bootstrap",
    "seed",
    *OLD_COLUMNS[7:],
)
_BEFORE_RETRIEVAL = (*_BEFORE_G_KIND[:-1], "g_kind", _BEFORE_G_KIND[-1])
_BEFORE_S_KIND = (*_BEFORE_RETRIEVAL[:-1], "retrieval", _BEFORE_RETRIEVAL[-1])
PAST_COLUMNS = (
    OLD_COLUMNS,
    (*OLD_COLUMNS[:7], "language", "ci_low", "ci_high", "n_units", "bootstrap", "seed", *OLD_COLUMNS[7:]),
    _BEFORE_G_KIND,
    _BEFORE_RETRIEVAL,
    _BEFORE_S_KIND,
)
#: `retrieval`: how a cross-encoder ranked (method, k, first stage; training/rerank.py), null
#: for a dual encoder's and for an unranked task's row; `s_kind`: a PN row's s (#51).
COLUMNS = (*_BEFORE_S_KIND[:-1], "s_kind", _BEFORE_S_KIND[-1])
#: Record fields stored as JSON strings.
JSON_FIELDS = (*PER_METRIC, "bootstrap", "seed", "retrieval")
RETRIES = 3


def record_key(record: dict) -> str:
    """A record's identity in the repo. An ITM record's G is part of it unless it is the cosine,
    the G of every record pushed before `g_kind` existed: those keep their keys, and a CLIP's
    logits_per_text deltas are never taken for its cosine ones already there."""
    g_kind = record.get("g_kind")
    extra = [g_kind] if g_kind not in (None, "cosine") else []
    if record.get("retrieval"):  # one cross-encoder re-ranking two first stages: two records
        extra.append(record["retrieval"])
    return json.dumps([record.get(f) for f in KEY_FIELDS] + extra)


def to_row(record: dict) -> dict:
    row = {c: record.get(c) for c in COLUMNS}
    for name in JSON_FIELDS:
        if name in record:
            row[name] = json.dumps(record[name], sort_keys=True, allow_nan=False)
    row["key"] = record_key(record)
    return row


def to_record(row: dict) -> dict:
    """A row as a record (`to_row` inverted; a row of an older version has no intervals)."""
    return {**row, **{name: json.loads(row[name]) for name in JSON_FIELDS if row.get(name) is not None}}


def _parquet(rows: list[dict]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Every column a string, also when a push's values are all null (`pretrained` of HF models).
    schema = pa.schema([(c, pa.string()) for c in COLUMNS])
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), buf)
    return buf.getvalue()


def card(rows: list[dict], repo_id: str) -> str:
    records = [to_record(r) for r in rows]
    models = list(dict.fromkeys(r["model"] for r in records if r["task"] != BLIND))
    out = [
        "---",
        "configs:",
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        "    path: data/*.parquet",
        "tags:",
        "- counterfactory",
        "- benchmark",
        "---",
        "",
        f"# {plain(repo_id)}",
        "",
        "Results of `counterfactory benchmark`: one row per model x dataset x metric module "
        "(`metrics` is a JSON object), with the weights' sha256, the dataset commit and the "
        "metric and code versions, and each metric's 95 % interval (`ci_low`, `ci_high`, over "
        "`n_units` units in `n_clusters` clusters, made by `ci_method`; where there is none, "
        "`ci_note` says why) and chance level (`chance`). A best value (fraction below zero: "
        "lowest; every other metric: highest) is bold where its interval and the runner-up's do not overlap; "
        "where they do, the column says `no significant difference` (which is no evidence the "
        "models are equal; the model report tests them paired); `n (units)` gives each "
        "column's units (and clusters where they differ), marked `small sample` below "
        f"{SMALL_SAMPLE} independent ones; rows without intervals (older versions) are ranked "
        "untested.",
        "",
        "```python",
        "from datasets import load_dataset",
        "",
        f'rows = load_dataset({repo_id!r}, split="train")',
        "```",
        "",
    ]
    for dataset in dict.fromkeys(r["dataset"] for r in records):
        out += [f"## {plain(dataset)}", "", *comparison_table(records, dataset, models), ""]
        blind = blind_lines(records, dataset)
        out += [*blind, ""] if blind else []
    return "\n".join(out)


def push_results(records: list[dict], repo_id: str, tag: str | None = None) -> int:
    """Append `records` to the dataset `repo_id` (created when missing); the number of rows
    added. With `tag`, the pushed state is tagged (a tag that exists is kept when nothing was
    added, refused otherwise)."""
    from huggingface_hub import HfApi

    check_repo_id(repo_id)
    endpoint = use_endpoint(None)
    api = HfApi(endpoint=endpoint)
    repo = dict(repo_id=repo_id, repo_type="dataset")
    with hub_errors(endpoint, repo_id, "re-run the same command (records already there are skipped)"):
        retrying(lambda: api.create_repo(**repo, exist_ok=True), RETRIES, "create_repo")
        old, old_files = _existing_rows(api, repo)
        known = {r["key"] for r in old}
        new = list({to_row(r)["key"]: to_row(r) for r in records if record_key(r) not in known}.values())
        tags = {t.name for t in retrying(lambda: api.list_repo_refs(**repo), RETRIES, "list_repo_refs").tags}
        if tag in tags and new:
            raise _tag_error(repo_id, tag)
        if new:
            _commit(api, repo, repo_id, old, new, old_files)
        if tag and tag not in tags:
            head = retrying(lambda: api.repo_info(**repo).sha, RETRIES, "repo_info")
            retrying(lambda: api.create_tag(**repo, tag=tag, revision=head), 1, "create_tag")
    log.info("%s: %d new rows, %d already there", repo_id, len(new), len(records) - len(new))
    return len(new)


def _tag_error(repo_id: str, tag: str) -> PublishError:
    return PublishError(
        f"--revision-tag {tag!r}: {repo_id} already has that tag and this push adds rows; give a new tag"
    )


def _commit(api, repo: dict, repo_id: str, old: list[dict], new: list[dict], old_files: dict[str, list[dict]]) -> None:
    """One commit: the new rows' file, the old-schema files rewritten with the new columns
    (`old_files`: path -> its rows), and the card."""
    from huggingface_hub import CommitOperationAdd

    name = hashlib.sha256("".join(sorted(r["key"] for r in new)).encode()).hexdigest()[:16]
    ops = [
        CommitOperationAdd(path_in_repo=f"data/results-{name}.parquet", path_or_fileobj=_parquet(new)),
        *(CommitOperationAdd(path_in_repo=path, path_or_fileobj=_parquet(rows)) for path, rows in old_files.items()),
        CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card(old + new, repo_id).encode()),
    ]
    models = ", ".join(dict.fromkeys(r["model"] for r in new))
    retrying(
        lambda: api.create_commit(
            **repo, operations=ops, commit_message=f"benchmark results: {len(new)} rows ({models})"[:200]
        ),
        1,
        "create_commit",
    )


def _existing_rows(api, repo: dict) -> tuple[list[dict], dict[str, list[dict]]]:
    """Every row already in the repo, each checked (`_check_row`): a push builds its card and key
    set from them, so a file or row this tool does not write refuses the push (nothing changed);
    and the files of an earlier schema (`PAST_COLUMNS`), path -> rows, to rewrite."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from huggingface_hub import hf_hub_download

    files = retrying(lambda: api.list_repo_files(**repo), RETRIES, "list_repo_files")
    rows: list[dict] = []
    old_files: dict[str, list[dict]] = {}
    for path in sorted(f for f in files if f.startswith("data/") and f.endswith(".parquet")):
        local = retrying(
            lambda: hf_hub_download(**repo, filename=path, endpoint=api.endpoint), RETRIES, f"download {path}"
        )
        where = f"{repo['repo_id']}: {path}"
        try:
            table = pq.read_table(local)
        except (pa.ArrowException, OSError, ValueError) as err:
            raise _hostile(where, f"not a parquet file ({type(err).__name__})") from None
        older = any(sorted(table.column_names) == sorted(past) for past in PAST_COLUMNS)
        missing = [c for c in COLUMNS if c not in table.column_names]
        extra = [c for c in table.column_names if c not in COLUMNS]
        if (missing or extra) and not older:
            # One schema for every file, or `load_dataset` cannot read the repo after this push.
            raise _hostile(
                where,
                f"no column {', '.join(map(repr, missing))}"
                if missing
                else f"column {', '.join(map(repr, extra))} is not one of {', '.join(COLUMNS)}",
            )
        file_rows = [{c: row.get(c) for c in COLUMNS} for row in table.to_pylist()]
        for n, row in enumerate(file_rows):
            _check_row(row, f"{where} row {n}")
        rows += file_rows
        if older:
            old_files[path] = file_rows
    return rows, old_files


def _hostile(where: str, problem: str) -> PublishError:
    return PublishError(
        f"{where}: {problem}, not a row `counterfactory benchmark` writes; nothing "
        "was pushed: fix or remove that file in the repo, or push to another repo"
    )


def _check_row(row: dict, where: str) -> None:
    """One existing row as `to_row` writes it: string columns, `metrics` a JSON object of
    numbers (null: a NaN statistic), and each per-metric field an object of its type."""
    for column, value in row.items():
        if value is not None and not isinstance(value, str):
            raise _hostile(where, f"{column!r} is a {type(value).__name__}, not text")
    for column in ("key", "model", "dataset", "task", "metrics"):
        if not row[column]:
            raise _hostile(where, f"{column!r} is empty")
    for column, kind in PER_METRIC.items():
        if row[column] is None and column != "metrics":
            continue  # a row of an earlier version: not there
        values = _json(row[column], column, where)
        if not isinstance(values, dict):
            raise _hostile(where, f"{column!r} is a JSON {type(values).__name__}, not an object")
        for name, value in values.items():
            if value is not None and not _is(kind, value):
                raise _hostile(where, f"{'metric' if column == 'metrics' else column} {name!r} is not a {kind}")
    if row.get("retrieval") is not None and not isinstance(_json(row["retrieval"], "retrieval", where), dict):
        raise _hostile(where, "'retrieval' is not a JSON object")
    for column in ("bootstrap", "seed"):
        if row[column] is not None:
            value = _json(row[column], column, where)
            if isinstance(value, bool) or not isinstance(value, int):
                raise _hostile(where, f"{column!r} is not an integer")


def _json(text: str, column: str, where: str):
    """The JSON of one column as `to_row` writes it (`allow_nan=False`): Python's json reads
    `NaN` and `Infinity`, which no row of ours holds (a NaN statistic is null), and a value nested
    100,000 deep raises RecursionError, not JSONDecodeError (#49)."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except _NonFinite as err:
        raise _hostile(where, f"{column!r} holds {err}, not a finite number") from None
    except RecursionError:
        raise _hostile(where, f"{column!r} is JSON nested too deep to read") from None
    except ValueError:  # JSONDecodeError is a ValueError
        raise _hostile(where, f"{column!r} is not JSON") from None


class _NonFinite(ValueError):
    pass


def _no_constant(name: str):
    raise _NonFinite(name)


def _finite(text: str) -> float:
    value = float(text)  # 1e999 reads as inf
    if not math.isfinite(value):
        raise _NonFinite(text[:40])
    return value


def _is(kind: str, value) -> bool:
    if kind == "number":
        return not isinstance(value, bool) and isinstance(value, (int, float))
    return isinstance(value, bool if kind == "boolean" else str)
