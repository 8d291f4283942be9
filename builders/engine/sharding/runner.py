"""Run a `ShardedBuilder`: assign parts to processes, resume, report progress, then merge.

Parts are consecutive chunks of `part_size` work items, numbered from 0; process r of w takes the
parts k with k % w == r. Part boundaries never depend on the number of processes, and rows only
depend on their own items, so 1 or N processes (or N machines sharing a folder) produce identical
shards. Each process reads the work items once and keeps only its own parts' items (`shares`).
A part is finished once its stats file exists (see `part_writer`), which is what a
resumed run checks (one the build did not write is rebuilt: `resume.finished_stats`), and every
merge checks each part against the digest its stats record (`part_files`). A re-run of a finished build has nothing to do and returns at once (see
`up_to_date`).

Job arrays (preemptible clusters, no rendezvous): worker i of n (`BuildRunConfig.worker_index`,
`num_workers`) builds the same parts rank i of n would, then exits without merging; it holds only
its own worker lock while building, and the folder's lock while it checks or writes the run
fingerprint, so n workers starting at once agree on one `run.json`. A final `merge_only` run
writes the dataset once every part exists, or names the missing parts and their workers.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from builders.engine import progress
from builders.engine.distributed import ProcessGroup, init_process_group, launched_world_size
from builders.engine.errors import UserFacingError
from builders.engine.sharding.base import Count, Emit, OutputSpec, ShardedBuilder, Skip
from builders.engine.sharding.inputs import part_digests, split_problems
from builders.engine.sharding.layout import OutputLayout
from builders.engine.sharding.output_guard import (
    check_output_folder,
    output_errors,
    output_lock,
    remove_part_temp_files,
    remove_temp_files,
    running_workers,
    worker_lock,
)
from builders.engine.sharding.merge import Finisher, collect_stats, merge_parts
from builders.engine.sharding.part_files import PART_FILES, BookkeepingError, load_stats
from builders.engine.sharding.part_writer import peak_rss_bytes, rows_to_table, write_json, write_parquet
from builders.engine.sharding.run_config import BuildRunConfig
from builders.engine.sharding.resume import finished_stats, fingerprint, part_changes, prepare_resume
from builders.engine.sharding.shares import ItemShare, check_has_items, check_same_inputs, share_items
from builders.engine.sharding.up_to_date import finished_manifest, invalidate

log = logging.getLogger(__name__)


#: How long the main process waits, after every process finished, for the parts other machines
#: wrote to appear in the shared folder (a network filesystem may show another client's new files
#: late, e.g. NFS's cached lookups), before concluding the folder is not shared.
SHARED_FOLDER_WAIT_S = 60.0

#: How long an array worker waits for the folder's lock, which other workers hold only while
#: checking the fingerprint (a build or merge holding it longer makes the worker fail).
ARRAY_LOCK_WAIT_S = 120.0


@dataclass
class BuildResult:
    output_dir: Path
    manifest: dict[str, Any]


def _log_part_done(
    tracker: progress.Tracker,
    group: ProcessGroup,
    part: int,
    parts_done: int,
    parts_total: int,
    rows: int,
    skipped: int,
) -> None:
    log.info(
        "[rank %d/%d] part %d done (%d/%d parts, %d/%d items): %d rows, %d skipped; %.1f items/s, ETA %s",
        group.rank,
        group.world_size,
        part,
        parts_done,
        parts_total,
        tracker.done,
        tracker.total,
        rows,
        skipped,
        tracker.rate(),
        progress.format_eta(tracker.eta()),
    )


def _part_needs_work(layout: OutputLayout, part: int, keys: Sequence[str], retry_errors: bool) -> bool:
    stats = finished_stats(layout, part, keys)
    return stats is None or (retry_errors and bool(stats["errors"]))


def _build_part(
    builder: ShardedBuilder,
    outputs: Sequence[OutputSpec],
    layout: OutputLayout,
    part: int,
    items: Sequence[Any],
    group: ProcessGroup,
) -> dict[str, Any]:
    by_key = {spec.key: spec for spec in outputs}
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    filtered: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    t0 = time.perf_counter()
    usable, problems = split_problems(items)
    # Items the reader marked malformed are counted as input errors and never reach the builder.
    for record in itertools.chain(problems, builder.process(usable) if usable else ()):
        if isinstance(record, Emit):
            if record.output not in by_key:
                raise ValueError(f"builder emitted a row for unknown output {record.output!r}")
            rows[record.output].append(record.row)
        elif isinstance(record, Skip):
            (errors if record.kind == "error" else filtered)[record.reason] += 1
            if record.kind == "error":
                log.warning("part %d: skipped an item (%s): %s", part, record.reason, record.detail)
        elif isinstance(record, Count):
            counts[record.name] += record.n
        else:
            raise TypeError(f"builder yielded {type(record).__name__}, expected Emit, Skip or Count")
    t1 = time.perf_counter()
    files = {}
    for key, spec in by_key.items():
        rel = layout.rel(layout.part_file(key, part))
        if rows.get(key):
            files[key] = write_parquet(layout.out, rel, rows_to_table(rows[key], spec.features))
        else:  # a leftover of an earlier attempt at this part
            layout.out.unlink(rel, missing_ok=True)
    t2 = time.perf_counter()
    stats = {
        "part": part,
        "items": len(items),
        "rows": {key: len(rows.get(key, [])) for key in by_key},
        # What the merge checks each part file against (sha256 and size of the bytes written).
        PART_FILES: files,
        "skipped": dict(sorted(filtered.items())),
        "errors": dict(sorted(errors.items())),
        "counts": dict(sorted(counts.items())),
        # What this part was built from: a resume compares it with the current inputs.
        "item_digests": part_digests(items),
        "timings": {"process_s": round(t1 - t0, 4), "write_s": round(t2 - t1, 4)},
        # The process's peak so far: its parts run in sequence, so the last part's is its peak.
        "peak_rss_bytes": peak_rss_bytes(),
        "rank": group.rank,
        "world_size": group.world_size,
    }
    # Written last: its presence is what marks the part finished.
    write_json(layout.out, layout.rel(layout.stats_file(part)), stats)
    return stats


def run_build(builder: ShardedBuilder, cfg: BuildRunConfig, finish: Finisher | None = None) -> BuildResult | None:
    """Build (or resume) `builder` into `cfg.output_dir`. Returns the result on the main process.

    `finish` writes the card beside the shards (`publishing.card.write_card` for a published
    build), under the output lock and before the manifest; see `merge.merge_parts`.
    """
    if cfg.part_size < 1:
        raise UserFacingError(f"--part-size must be at least 1 (got {cfg.part_size})")
    # Every write below the output goes through its root, opened once for the run (`layout.out`).
    with OutputLayout(Path(cfg.output_dir)) as layout:
        if cfg.merge_only or cfg.num_workers is not None:
            _check_array_config(cfg)
            with output_errors(layout.root):
                check_output_folder(layout)
                if cfg.merge_only:
                    return _merge_only(builder, cfg, layout, finish)
                return _run_array_worker(builder, cfg, layout)
        group = init_process_group(cfg.expect_processes)
        try:
            with output_errors(layout.root):
                if not group.is_main:
                    return _run_locked(builder, cfg, group, layout, finish)
                check_output_folder(layout)
                with output_lock(layout):
                    _check_no_workers(layout)
                    return _run_locked(builder, cfg, group, layout, finish)
        finally:
            group.close()


def _read_share(
    builder: ShardedBuilder,
    cfg: BuildRunConfig,
    layout: OutputLayout,
    owns: Callable[[int], bool],
    check: bool,
    group: ProcessGroup | None = None,
) -> ItemShare:
    """Read the inputs once, keeping this process's parts; `check`: also compare the finished
    parts with them (the process that prepares the resume). With a `group` of several processes,
    every one must have read the same inputs (`check_same_inputs`). No input is an error."""
    # The inputs are read before anything is written: a run that fails on a missing or broken
    # input leaves no fingerprint behind to refuse the corrected rerun.
    keys = [spec.key for spec in builder.outputs()]
    several = group is not None and group.world_size > 1
    share = share_items(
        builder.work_items(),
        cfg.part_size,
        owns,
        part_changes(layout, keys, cfg.retry_errors) if check else None,
        digest=several,
    )
    if several:
        assert group is not None
        # Before the empty check: a process whose inputs alone are empty must not leave the
        # others waiting in this exchange.
        check_same_inputs(group, share, builder.source_option())
    check_has_items(share, builder.source_option())
    return share


def _run_locked(
    builder: ShardedBuilder, cfg: BuildRunConfig, group: ProcessGroup, layout: OutputLayout, finish: Finisher | None
) -> BuildResult | None:
    done = _finished(builder, cfg, layout, finish) if group.is_main else None
    # Every process follows the main one's answer: the others must not wait at a barrier it skips.
    if group.from_main(done is not None):
        # A broadcast returns on the main process before the others have read it; the barrier
        # keeps it from tearing the group down (and exiting) under them.
        group.barrier()
        return _nothing_to_do(cfg, layout, done) if done is not None else None
    outputs = list(builder.outputs())
    share = _read_share(
        builder, cfg, layout, lambda k: k % group.world_size == group.rank, check=group.is_main, group=group
    )
    if group.is_main:
        remove_temp_files(layout)
        prepare_resume(layout, fingerprint(builder, cfg.part_size), share, cfg.overwrite)
    group.barrier()
    _build_mine(builder, outputs, layout, share, group, cfg.retry_errors)
    group.barrier()
    if not group.is_main:
        return None
    if group.world_size > 1:
        _wait_for_other_processes_parts(layout, share.n_parts, group.world_size)
    return _merge(builder, cfg, layout, outputs, share, group.world_size, finish)


def _build_mine(
    builder: ShardedBuilder,
    outputs: Sequence[OutputSpec],
    layout: OutputLayout,
    share: ItemShare,
    group: ProcessGroup,
    retry_errors: bool,
) -> None:
    """Build this process's unfinished parts (`share.mine`: k % world_size == rank)."""
    keys = [spec.key for spec in outputs]
    todo = [(k, chunk) for k, chunk in share.mine if _part_needs_work(layout, k, keys, retry_errors)]
    log.info(
        "[rank %d/%d] %d items in %d parts; this process: %d parts, %d already finished",
        group.rank,
        group.world_size,
        share.n_items,
        share.n_parts,
        len(share.mine),
        len(share.mine) - len(todo),
    )
    if todo:
        invalidate(layout)  # the merged output no longer matches the parts
    # One live tracker per process: a bar on a terminal, periodic log lines otherwise.
    with progress.track(
        sum(len(chunk) for _, chunk in todo), f"[rank {group.rank}/{group.world_size}]", position=group.rank
    ) as tracker:
        for n, (k, chunk) in enumerate(todo, start=1):
            stats = _build_part(builder, outputs, layout, k, chunk, group)
            tracker.part_done(len(chunk))
            skipped = sum(stats["skipped"].values()) + sum(stats["errors"].values())
            _log_part_done(tracker, group, k, n, len(todo), sum(stats["rows"].values()), skipped)


def _merge(
    builder: ShardedBuilder,
    cfg: BuildRunConfig,
    layout: OutputLayout,
    outputs: Sequence[OutputSpec],
    share: ItemShare,
    world_size: int,
    finish: Finisher | None,
    stats: list[dict[str, Any]] | None = None,
) -> BuildResult:
    """Merge the finished parts (their `stats`, when the caller has read them already)."""
    if stats is None:
        stats = collect_stats(layout, share.n_parts, [spec.key for spec in outputs])
    _check_error_rate(stats, share.n_items, cfg.max_error_fraction, layout)
    manifest = merge_parts(
        layout=layout,
        outputs=outputs,
        stats=stats,
        n_items=share.n_items,
        info=builder.info(),
        run_config={**asdict(cfg), "output_dir": str(cfg.output_dir)},
        world_size=world_size,
        max_shard_bytes=cfg.max_shard_bytes,
        finish=finish,
    )
    return BuildResult(output_dir=layout.root, manifest=manifest)


def _wait_for_other_processes_parts(layout: OutputLayout, n_parts: int, world_size: int) -> None:
    """Every process passed the barrier after building its parts, so each part exists somewhere:
    one still missing here after `SHARED_FOLDER_WAIT_S` was written to another machine's disk."""
    deadline = time.monotonic() + SHARED_FOLDER_WAIT_S
    stats_dir = layout.stats_file(0).parent
    expected = {layout.stats_file(k).name: k for k in range(n_parts)}
    while True:
        # Listing the folder (not a lookup per file) revalidates a network filesystem's cache.
        missing = sorted(set(expected) - set(os.listdir(stats_dir) if stats_dir.is_dir() else ()))
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    if missing:
        first = expected[missing[0]]
        raise UserFacingError(
            f"{len(missing)} of {n_parts} parts that the other processes built are not in "
            f"{layout.root} (first: part {first}, by rank {first % world_size}); on several "
            "machines --output must be one folder that all of them share (a network filesystem), "
            "not a local path on each machine"
        )


def _finished(
    builder: ShardedBuilder, cfg: BuildRunConfig, layout: OutputLayout, finish: Finisher | None
) -> dict[str, Any] | None:
    """The manifest of the finished build this run would make again (`up_to_date`), else None.
    `--overwrite` always re-reads the inputs, to rebuild from changed ones."""
    if cfg.overwrite:
        return None
    return finished_manifest(
        layout,
        fingerprint(builder, cfg.part_size),
        cfg.max_shard_bytes,
        cfg.retry_errors,
        with_card=finish is not None,
    )


def _nothing_to_do(cfg: BuildRunConfig, layout: OutputLayout, manifest: dict[str, Any]) -> BuildResult:
    # A stricter --max-error-fraction still fails the finished build, as it would after a merge.
    _check_error_rate([{"errors": manifest["errors"]}], manifest["items"], cfg.max_error_fraction, layout)
    log.info(
        "nothing to do: %s is a finished build of the same configuration (%d parts; its shards "
        "and card match build_manifest.json); its inputs were not re-read — rebuild from "
        "changed inputs with --overwrite",
        layout.root,
        manifest["run"]["parts"],
    )
    return BuildResult(output_dir=layout.root, manifest=manifest)


def _check_array_config(cfg: BuildRunConfig) -> None:
    if launched_world_size() > 1:
        raise UserFacingError(
            "a job-array worker or --merge-only run is one process: start it "
            "directly (`counterfactory build ...`), not under accelerate launch"
        )
    if cfg.overwrite:
        raise UserFacingError(
            "--overwrite cannot be used with --worker-index/--num-workers or "
            "--merge-only (one worker would delete the others' parts); discard "
            "the old build with one ordinary --overwrite run, or use a new --output"
        )


def _check_no_workers(layout: OutputLayout) -> None:
    running = running_workers(layout)
    if running:
        raise UserFacingError(
            f"array worker(s) {', '.join(map(str, running))} are still writing "
            f"to {layout.root}; wait for them to finish (then run --merge-only)"
        )


def _run_array_worker(builder: ShardedBuilder, cfg: BuildRunConfig, layout: OutputLayout) -> None:
    worker, n_workers = cfg.worker_index, cfg.num_workers
    assert worker is not None and n_workers is not None
    group = ProcessGroup(rank=worker, world_size=n_workers, barrier=lambda: None)
    outputs = list(builder.outputs())
    share = _read_share(builder, cfg, layout, lambda k: k % n_workers == worker, check=True)
    with worker_lock(layout, worker):
        # The first worker writes run.json; the others, serialised by the lock, find it and
        # resume (an identical fingerprint) or refuse (a different one).
        with output_lock(layout, wait_s=ARRAY_LOCK_WAIT_S):
            prepare_resume(layout, fingerprint(builder, cfg.part_size), share, cfg.overwrite)
        remove_part_temp_files(layout, [spec.key for spec in outputs], [k for k, _ in share.mine])
        _build_mine(builder, outputs, layout, share, group, cfg.retry_errors)
    log.info(
        "array worker %d of %d finished its parts; once every worker has, run the same "
        "command with --merge-only to write the dataset",
        worker,
        n_workers,
    )


def _merge_only(
    builder: ShardedBuilder, cfg: BuildRunConfig, layout: OutputLayout, finish: Finisher | None
) -> BuildResult:
    with output_lock(layout):
        _check_no_workers(layout)
        done = _finished(builder, cfg, layout, finish)
        if done is not None:
            return _nothing_to_do(cfg, layout, done)
        outputs = list(builder.outputs())
        # The merge needs the inputs' size only: no part is kept.
        share = _read_share(builder, cfg, layout, lambda k: False, check=True)
        remove_temp_files(layout)
        prepare_resume(layout, fingerprint(builder, cfg.part_size), share, cfg.overwrite)
        stats, n_workers = _workers_stats(layout, outputs, share.n_parts, cfg.num_workers)
        return _merge(builder, cfg, layout, outputs, share, n_workers, finish, stats)


def _workers_stats(
    layout: OutputLayout, outputs: Sequence[OutputSpec], n_parts: int, num_workers: int | None
) -> tuple[list[dict[str, Any]], int]:
    """Every part's stats for `--merge-only`, and the worker count (`--num-workers`, else the
    one the parts were built with); one line naming a missing part or a stats file that is not
    one a worker wrote (a merge cannot rebuild it, as a build does), with the worker to re-run."""
    keys = [spec.key for spec in outputs]
    stats: dict[int, dict[str, Any] | None] = {}
    bad: list[tuple[int, BookkeepingError]] = []
    for k in range(n_parts):
        try:
            stats[k] = load_stats(layout, k, keys)
        except BookkeepingError as err:
            bad.append((k, err))
    sizes = Counter(s["world_size"] for s in stats.values() if s is not None)
    n_workers = num_workers or (sizes.most_common(1)[0][0] if sizes else None)
    if bad:
        k, err = bad[0]
        worker = f"worker {k % n_workers} of --num-workers {n_workers}" if n_workers else "its worker"
        raise UserFacingError(
            f"{err.path} {err.problem}; remove it, re-run {worker} to build part {k} again, then --merge-only"
        )
    missing = [k for k in range(n_parts) if stats.get(k) is None]
    if missing:
        raise UserFacingError(_missing_parts_message(layout, missing, n_parts, n_workers))
    return [s for s in stats.values() if s is not None], n_workers or 1


def _missing_parts_message(layout: OutputLayout, missing: Sequence[int], n_parts: int, n_workers: int | None) -> str:
    shown = missing[:10]
    more = f" and {len(missing) - len(shown)} more" if len(missing) > len(shown) else ""
    if n_workers is None:
        named = ", ".join(f"part {k}" for k in shown)
        how = "pass --num-workers N to name the workers that build them"
    else:
        named = ", ".join(f"part {k} (worker {k % n_workers})" for k in shown)
        how = f"re-run those workers of --num-workers {n_workers}, then --merge-only again"
    return f"{len(missing)} of {n_parts} parts of {layout.root} are missing: {named}{more}; {how}"


def _check_error_rate(
    stats: Sequence[dict[str, Any]], n_items: int, max_fraction: float, layout: OutputLayout
) -> None:
    errors: Counter[str] = Counter()
    for s in stats:
        errors.update(s["errors"])
    n_errors = sum(errors.values())
    if n_items and n_errors / n_items > max_fraction:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(errors.items()))
        raise UserFacingError(
            f"{n_errors} of {n_items} items failed on bad input ({reasons}), more than "
            f"--max-error-fraction {max_fraction}; finished parts are kept in {layout.parts} "
            "(per-part reasons in stats/); fix the inputs and re-run with --retry-errors"
        )
