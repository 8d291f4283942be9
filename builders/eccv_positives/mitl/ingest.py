"""Stage 3 of a MITL round: human verdicts -> quality control -> positives -> a new version
(METHOD.md §4).

Verdicts come as Label Studio JSON exports (of `label_studio_tasks.json`) or CSV files with
columns `task_id, item_id, worker_id, answer`. One worker's answers to one task form a
submission; a submission counts once it answers all 20 items (Label Studio shows each pair as
its own task, so an export often holds a worker's task half done: such a submission is skipped,
counted per worker and per task in the report, and may be completed by a later export). Every
file is checked completely before anything is stored, and the verdict store
(`state/verdicts.json`) is replaced atomically, so a bad file (unknown ids, an item answered
twice, a task already answered) is rejected with the file and row at fault and what was
ingested before stays intact.

Quality control: a submission fails when it calls its golden positive a NO or its golden
negative a YES; failing submissions are excluded by default (counts per worker and per task are
reported either way). A pair is positive when more than half of its kept verdicts are positive
("100% YES" or "Partially YES", or only "100% YES" with `strict`). Then the invalid captions and
the duplicate image of the paper's Appendix C.1 are removed and the result is merged with CxC and
the original gallery pairs (CxC: the ids shipped with `eccv_caption`, or CxC's rating files with
a score threshold), written in the `eccv_caption` file format next to `mitl_report.json`, and
built with the eccv-positives builder. Appendix C.1 and CxC name COCO ids: a `--dataset` gallery's
ids are its own (row numbers by default), so both are skipped there unless `coco_ids` says its
ids are COCO's (or CxC files are given explicitly).
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from builders.eccv_positives.config import DUPLICATE_IMAGES, INVALID_CAPTION_IDS, MITL_REPORT
from builders.eccv_positives.source import write_positives
from builders.eccv_positives.mitl.candidates import Candidates
from builders.eccv_positives.mitl.cxc import read_cxc_sits
from builders.eccv_positives.mitl.tasks import ANSWERS, load_tasks
from builders.engine.errors import InputFileError

log = logging.getLogger(__name__)

CSV_COLUMNS = ("task_id", "item_id", "worker_id", "answer")


@dataclass
class IngestConfig:
    """Example: `IngestConfig(verdicts=("export.json",), tasks="run/tasks", state="run/state")`."""

    verdicts: tuple[str, ...]
    #: tasks.json (or its folder) written by `counterfactory eccv tasks`.
    tasks: str
    #: Folder accumulating verdicts across calls; the positives are written to `state/annotations`.
    state: str
    #: Positives are "100% YES" only (default: also "Partially YES").
    strict: bool = False
    #: Drop submissions that fail a golden item (default, as the paper's qualification does).
    exclude_failed_golden: bool = True
    #: CxC positives to merge: folder in the eccv_caption format (default: the package's) ...
    cxc_dir: str | None = None
    #: ... or CxC's own rating files (sits_*.csv), thresholded at `cxc_min_score` (paper: 3).
    cxc_sits: tuple[str, ...] = ()
    cxc_min_score: float = 3.0
    #: The gallery's ids are COCO ids, so CxC's ids and Appendix C.1's apply (default: true for
    #: a COCO gallery, false for a --dataset one, whose ids may collide with COCO's).
    coco_ids: bool | None = None


def _positive(answer: str, strict: bool) -> bool:
    return answer == ANSWERS[0] or (not strict and answer == ANSWERS[1])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_csv(path: Path) -> list[dict[str, Any]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise InputFileError(
                path,
                f"malformed verdict CSV: header lacks {missing}",
                f"the header must name {', '.join(CSV_COLUMNS)}",
            )
        rows = []
        for line, row in enumerate(reader, start=2):
            empty = [c for c in CSV_COLUMNS if not (row.get(c) or "").strip()]
            if empty:
                raise InputFileError(path, f"row {line}: empty {empty}", "fill in every column or drop the row")
            rows.append(
                {
                    "task_id": row["task_id"].strip(),
                    "item_id": row["item_id"].strip(),
                    "worker": row["worker_id"].strip(),
                    "answer": row["answer"].strip(),
                    "where": f"row {line}",
                }
            )
    return rows


def _worker(annotation: dict[str, Any]) -> str:
    who = annotation.get("completed_by")
    if isinstance(who, dict):
        who = who.get("email") or who.get("id")
    return str(who)


def _read_label_studio(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise InputFileError(
            path,
            f"malformed JSON at line {err.lineno} column {err.colno}: {err.msg}",
            "export the project again from Label Studio (JSON)",
        ) from err
    if not isinstance(data, list):
        raise InputFileError(
            path,
            "a Label Studio export is a JSON list of tasks",
            "export the project as JSON (not JSON-MIN or a single task)",
        )
    rows = []
    for n, task in enumerate(data):
        where = f"task #{n}"
        try:
            task_id, item_id = task["data"]["task_id"], task["data"]["item_id"]
            annotations = task.get("annotations", [])
            for annotation in annotations:
                if annotation.get("was_cancelled"):
                    continue
                choices = [r["value"]["choices"] for r in annotation["result"] if r.get("from_name") == "answer"]
                if len(choices) != 1 or len(choices[0]) != 1:
                    raise InputFileError(
                        path,
                        f"{where} (item {item_id}): expected one answer choice, got {choices}",
                        "re-annotate that item",
                    )
                rows.append(
                    {
                        "task_id": str(task_id),
                        "item_id": str(item_id),
                        "worker": _worker(annotation),
                        "answer": choices[0][0],
                        "where": where,
                    }
                )
        except (KeyError, TypeError) as err:
            raise InputFileError(
                path,
                f"{where}: malformed Label Studio task (missing {err})",
                "export with the label config written by `counterfactory eccv tasks`",
            ) from err
    return rows


def read_verdicts(path: Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise InputFileError(path, "verdict file is missing", "check the path")
    if path.suffix.lower() == ".csv":
        return _read_csv(path)
    return _read_label_studio(path)


class VerdictStore:
    """Verdicts ingested so far (`state/verdicts.json`), replaced atomically."""

    def __init__(self, state: Path) -> None:
        self.path = Path(state) / "verdicts.json"
        data = json.loads(self.path.read_text()) if self.path.is_file() else {"files": [], "verdicts": []}
        self.files: list[dict[str, Any]] = data["files"]
        self.verdicts: list[dict[str, Any]] = data["verdicts"]

    def submissions(self) -> set[tuple[str, str]]:
        return {(v["task_id"], v["worker"]) for v in self.verdicts}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"files": self.files, "verdicts": self.verdicts}))
        tmp.replace(self.path)


def _check(
    rows: list[dict[str, Any]],
    path: Path,
    items: dict[str, dict[str, Any]],
    task_sizes: dict[str, int],
    known: set[tuple[str, str]],
) -> list[dict[str, Any]]:
    """Unknown ids, bad answers, an item answered twice, a task answered again: one clear error.

    Returns the incomplete submissions (fewer items answered than the task has), which the
    caller skips: a partial export is normal, not a broken file."""
    seen: dict[tuple[str, str, str], str] = {}
    per_submission: Counter[tuple[str, str]] = Counter()
    for row in rows:
        where = f"{row['where']} (task {row['task_id']}, item {row['item_id']})"
        if row["task_id"] not in task_sizes:
            raise InputFileError(
                path,
                f"{where}: unknown task id",
                "verdicts must come from the tasks written by `counterfactory eccv tasks` (pass that --tasks)",
            )
        item = items.get(row["item_id"])
        if item is None or item["task_id"] != row["task_id"]:
            raise InputFileError(
                path, f"{where}: unknown item id for this task", "check the export belongs to these tasks"
            )
        if row["answer"] not in ANSWERS:
            raise InputFileError(
                path,
                f"{where}: answer {row['answer']!r} is not one of {list(ANSWERS)}",
                "use the label config written by `counterfactory eccv tasks`",
            )
        key = (row["task_id"], row["worker"], row["item_id"])
        if key in seen:
            raise InputFileError(
                path,
                f"{where}: worker {row['worker']} answered this item twice (also at {seen[key]})",
                "keep one answer per item",
            )
        if (row["task_id"], row["worker"]) in known:
            raise InputFileError(
                path,
                f"{where}: task {row['task_id']} was already answered by "
                f"worker {row['worker']} in an earlier verdict file",
                "a task is answered once per worker; drop the repeated submission",
            )
        seen[key] = row["where"]
        per_submission[(row["task_id"], row["worker"])] += 1
    return [
        {"task_id": task_id, "worker": worker, "answered": n, "items": task_sizes[task_id], "file": str(path)}
        for (task_id, worker), n in sorted(per_submission.items())
        if n < task_sizes[task_id]
    ]


def ingest(cfg: IngestConfig) -> dict[str, Any]:
    """Check and store the new verdicts, then recompute the positives. Returns the report."""
    manifest = load_tasks(Path(cfg.tasks))
    items = {i["item_id"]: {**i, "task_id": t["task_id"]} for t in manifest["tasks"] for i in t["items"]}
    task_sizes = {t["task_id"]: len(t["items"]) for t in manifest["tasks"]}
    store = VerdictStore(Path(cfg.state))
    known = store.submissions()
    new_files, new_rows = [], []
    for name in cfg.verdicts:
        path = Path(name)
        digest = _digest(path) if path.is_file() else None
        if digest and any(f["sha256"] == digest for f in store.files + new_files):
            log.info("%s: already ingested, skipped", path)
            continue
        rows = read_verdicts(path)
        incomplete = _check(rows, path, items, task_sizes, known)
        if incomplete:
            log.warning(
                "%s: %d incomplete submission(s) skipped (e.g. task %s, worker %s: %d of %d "
                "items); they count once a later file has all their items",
                path,
                len(incomplete),
                incomplete[0]["task_id"],
                incomplete[0]["worker"],
                incomplete[0]["answered"],
                incomplete[0]["items"],
            )
        # Not stored and not `known`: a later, fuller export of the same task is accepted.
        skipped = {(i["task_id"], i["worker"]) for i in incomplete}
        rows = [r for r in rows if (r["task_id"], r["worker"]) not in skipped]
        submissions = {(r["task_id"], r["worker"]) for r in rows}
        known |= submissions
        new_files.append(
            {"path": str(path), "sha256": digest, "submissions": len(submissions), "incomplete": incomplete}
        )
        new_rows += [{k: r[k] for k in ("task_id", "item_id", "worker", "answer")} for r in rows]
    cands = Candidates.load(Path(manifest["config"]["candidates"]))
    sources = _gallery_sources(cands, cfg)
    # Only now, with every input read and valid, does the store change.
    store.files += new_files
    store.verdicts += new_rows
    store.save()
    return write_positives_for(store, manifest, items, cfg, cands, sources)


@dataclass
class _Review:
    """Outcome of quality control and voting over every stored verdict."""

    submissions: int
    failed: set[tuple[str, str]]
    per_worker: dict[str, Counter[str]]
    per_task: dict[str, Counter[str]]
    #: (modality, query id, item id) -> verdict counts {positive?: n} of the kept submissions.
    votes: dict[tuple[str, int, int], Counter[bool]]

    def positives(self) -> dict[str, dict[int, set[int]]]:
        """modality -> query -> items that more than half of the kept verdicts call positive."""
        out: dict[str, dict[int, set[int]]] = {"i2t": {}, "t2i": {}}
        for (modality, query, item), c in self.votes.items():
            if c[True] > c[False]:
                out[modality].setdefault(query, set()).add(item)
        return out


def review(verdicts: list[dict[str, Any]], items: dict[str, dict[str, Any]], cfg: IngestConfig) -> _Review:
    by_submission: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for v in verdicts:
        by_submission[(v["task_id"], v["worker"])].append(v)
    result = _Review(len(by_submission), set(), defaultdict(Counter), defaultdict(Counter), defaultdict(Counter))
    for sub, answers in sorted(by_submission.items()):
        # Goldens are judged on YES/NO, whatever --strict says about candidates.
        ok = all(
            _positive(v["answer"], False) == (items[v["item_id"]]["kind"] == "golden_positive")
            for v in answers
            if items[v["item_id"]]["kind"] != "candidate"
        )
        if not ok:
            result.failed.add(sub)
        for counter in (result.per_worker[sub[1]], result.per_task[sub[0]]):
            counter["submissions"] += 1
            counter["failed_golden"] += not ok
        if not ok and cfg.exclude_failed_golden:
            continue
        for v in answers:
            item = items[v["item_id"]]
            if item["kind"] == "candidate":
                other = item["caption_id"] if item["modality"] == "i2t" else item["image_id"]
                result.votes[(item["modality"], item["query_id"], other)][_positive(v["answer"], cfg.strict)] += 1
    return result


def uses_coco_ids(cands: Candidates, cfg: IngestConfig) -> bool:
    return cfg.coco_ids if cfg.coco_ids is not None else cands.gallery.dataset is None


def _gallery_sources(cands: Candidates, cfg: IngestConfig):
    """The gallery's original pairs, the CxC positives restricted to the gallery (None when
    not merged), and which CxC was used."""
    from loading_scripts.eccv import Positives, read_positives

    g = cands.gallery
    coco_i2t: dict[int, list[int]] = defaultdict(list)
    for caption, image in zip(g.caption_ids, g.caption_image_ids, strict=True):
        coco_i2t[image].append(caption)
    coco = Positives(
        i2t={i: np.asarray(c, dtype=np.int64) for i, c in coco_i2t.items()},
        t2i={c: np.asarray([i], dtype=np.int64) for c, i in g.caption_image.items()},
    )
    if cfg.cxc_sits:
        shipped, which = read_cxc_sits(cfg.cxc_sits, cfg.cxc_min_score), "sits"
    elif cfg.cxc_dir or uses_coco_ids(cands, cfg):
        shipped = read_positives("cxc", Path(cfg.cxc_dir) if cfg.cxc_dir else None)
        which = "dir" if cfg.cxc_dir else "shipped"
    else:
        log.info(
            "dataset gallery: its ids are not COCO ids, so the shipped CxC pairs are not merged "
            "and the Appendix C.1 ids are not removed (pass --coco-ids if they are COCO ids)"
        )
        return coco, None, None
    images, captions = set(g.image_ids), set(g.caption_ids)
    cxc = Positives(i2t=_restricted(shipped.i2t, images, captions), t2i=_restricted(shipped.t2i, captions, images))
    return coco, cxc, which


def write_positives_for(
    store: VerdictStore,
    manifest: dict[str, Any],
    items: dict[str, dict[str, Any]],
    cfg: IngestConfig,
    cands: Candidates,
    sources: tuple,
) -> dict[str, Any]:
    """Quality control, vote, remove invalid items, merge; writes `state/annotations/`."""
    result = review(store.verdicts, items, cfg)
    human = result.positives()
    cxc_source = sources[2]
    remove_c1 = uses_coco_ids(cands, cfg)
    out = Path(cfg.state) / "annotations"
    removed = _write_annotations(human, manifest, sources, remove_c1, out)
    n_human = sum(len(v) for m in human.values() for v in m.values())
    incomplete = _count_incomplete(store, result)
    counts = ("submissions", "failed_golden", "incomplete")
    report = {
        # Provenance names only: the specs as given (`model_sources`) stay in the round's files.
        "models": cands.config["models"],
        "candidates_config": {k: v for k, v in cands.config.items() if k != "model_sources"},
        "queries": {m: len(manifest["queries"][m]) for m in ("i2t", "t2i")},
        "candidate_pairs": manifest["candidate_pairs"],
        "tasks": len(manifest["tasks"]),
        "task_seed": manifest["config"]["seed"],
        "verdict_files": store.files,
        "submissions": result.submissions,
        "failed_golden": len(result.failed),
        "failed_submissions": sorted(f"{t}/{w}" for t, w in result.failed),
        "exclude_failed_golden": cfg.exclude_failed_golden,
        "strict": cfg.strict,
        "incomplete_submissions": len(incomplete),
        "incomplete": [
            f"{i['task_id']}/{i['worker']} ({i['answered']} of {i['items']}, {i['file']})" for i in incomplete
        ],
        "verified_pairs": len(result.votes),
        "verified_positives": n_human,
        "gallery": "coco" if cands.gallery.dataset is None else "dataset",
        "cxc_merged": cxc_source,
        "appendix_c1_removal": remove_c1,
        "removed_invalid": removed,
        "per_worker": {w: {n: c[n] for n in counts} for w, c in sorted(result.per_worker.items())},
        "per_task": {t: {n: c[n] for n in counts} for t, c in sorted(result.per_task.items())},
        "human_positive_pairs": sorted([m, q, i] for m in human for q, v in human[m].items() for i in v),
        "config": {k: v for k, v in asdict(cfg).items() if k != "verdicts"},
    }
    (out / MITL_REPORT).write_text(json.dumps(report, indent=1))
    log.info(
        "ingested %d submissions (%d failed a golden, %d incomplete skipped); %d of %d verified pairs positive -> %s",
        result.submissions,
        len(result.failed),
        len(incomplete),
        n_human,
        len(result.votes),
        out,
    )
    return report


def _write_annotations(human: dict, manifest: dict[str, Any], sources: tuple, remove_c1: bool, out: Path) -> int:
    """Writes the round's three positive sets into `out`, as the ECCV loader reads them: `eccv`
    (the human positives merged with the shipped ones, `_merged`), `cxc` (empty when not merged)
    and `coco`; returns how many positives the Appendix C.1 removal took, for the report."""
    from loading_scripts.eccv import Positives

    coco, cxc, _ = sources
    merged, removed = _merged(human, manifest, coco, cxc, remove_c1)
    eccv = Positives(
        **{m: {q: np.asarray(sorted(v), dtype=np.int64) for q, v in merged[m].items() if v} for m in ("i2t", "t2i")}
    )
    no_cxc = Positives(i2t={}, t2i={})
    for name, positives in (("eccv", eccv), ("cxc", no_cxc if cxc is None else cxc), ("coco", coco)):
        write_positives(positives, out, name)
    return removed


def _count_incomplete(store: VerdictStore, result: _Review) -> list[dict[str, Any]]:
    """The submissions skipped as incomplete when their files were read, added to the review's
    per-worker and per-task counts (the report lists them beside the reviewed ones)."""
    # Stores written before incomplete submissions were skipped have no such list.
    incomplete = [i for f in store.files for i in f.get("incomplete", [])]
    for i in incomplete:
        result.per_worker[i["worker"]]["incomplete"] += 1
        result.per_task[i["task_id"]]["incomplete"] += 1
    return incomplete


def _merged(human: dict, manifest: dict[str, Any], coco, cxc, remove_c1: bool) -> tuple[dict, int]:
    """The human positives of every query with the shipped ones (CxC when merged, and COCO's), less
    the Appendix C.1 ids when `remove_c1`; and how many positives that removal took."""
    merged: dict[str, dict[int, set[int]]] = {"i2t": {}, "t2i": {}}
    for modality in ("i2t", "t2i"):
        for query in manifest["queries"][modality]:
            found = set(human[modality].get(query, ()))
            for source in (coco,) if cxc is None else (cxc, coco):
                found |= set(getattr(source, modality).get(query, np.empty(0)).tolist())
            merged[modality][query] = found
    removed = 0
    # Appendix C.1: invalid captions and the duplicate image go, as items and as queries (COCO
    # ids only: in a dataset gallery the same numbers name other captions).
    c1 = (("i2t", INVALID_CAPTION_IDS, set(DUPLICATE_IMAGES)), ("t2i", set(DUPLICATE_IMAGES), INVALID_CAPTION_IDS))
    for modality, invalid_items, invalid_queries in c1 if remove_c1 else ():
        for query in list(merged[modality]):
            if query in invalid_queries:
                removed += len(merged[modality].pop(query))
                continue
            before = len(merged[modality][query])
            merged[modality][query] -= invalid_items
            removed += before - len(merged[modality][query])
    return merged, removed


def _restricted(mapping: dict[int, np.ndarray], queries: set[int], items: set[int]) -> dict[int, np.ndarray]:
    """A positive mapping cut to a gallery: queries and items both inside it, empty ones dropped."""
    out = {}
    for query, ids in mapping.items():
        if query in queries:
            kept = ids[np.isin(ids, list(items))]
            if len(kept):
                out[query] = kept
    return out
