"""`BuildRunConfig`: how a build runs, as opposed to what it builds (the builder's own config).

Each field is also its flag (`builders.engine.options`), so `counterfactory build X` and
`accelerate launch builders/<dataset>/builder.py` take the same options with the same defaults,
declared here once. Light (no pyarrow or torch), so `--help` stays instant.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builders.engine.option_types import fraction, non_negative_int, positive_int
from builders.engine.options import option

#: Help group titles of the run options.
RUN, JOB_ARRAY = "run", "job array"


@dataclass
class BuildRunConfig:
    """How a build runs (not what it builds: that is the builder's own config)."""

    output_dir: Path = option(help="output folder (Hub layout)", flag="--output", group=RUN)
    #: Work items per part. Fixed per run (recorded in the fingerprint) so that resumes and any
    #: process count cut the same parts. Smaller parts resume more finely; larger ones write fewer files.
    part_size: int = option(
        64, "work items per resumable part (fixed for a build; default %(default)s)", group=RUN, type=positive_int
    )
    #: Target size of a published parquet shard (the Hub's viewer and loaders like ≤ 500 MB).
    max_shard_bytes: int = option(
        500_000_000,
        "target size of a published parquet shard in bytes (default %(default)s)",
        group=RUN,
        type=positive_int,
    )
    #: Fail the run (after keeping every finished part) when more than this fraction of items
    #: were skipped for input errors, so a mostly broken build cannot pass as a success.
    max_error_fraction: float = option(
        0.05, "fail when more than this fraction (0..1) of items hit input errors", group=RUN, type=fraction
    )
    #: Assert this many processes take part (catches `accelerate launch --cpu`, which runs one).
    expect_processes: int | None = option(
        None, "assert this many processes run (catches a mis-launched accelerate)", group=RUN, type=positive_int
    )
    #: Delete a previous build in `output_dir` made with a different config instead of failing.
    overwrite: bool = option(False, "discard a previous build with a different config in --output", group=RUN)
    #: On resume, redo finished parts that recorded input errors (after fixing the inputs).
    retry_errors: bool = option(False, "on resume, redo finished parts that recorded input errors", group=RUN)
    #: Job-array worker `worker_index` of `num_workers`: build parts k with k % num_workers ==
    #: worker_index, then exit without merging (a `merge_only` run merges).
    worker_index: int | None = option(
        None, "this worker's index, 0..N-1 (with --num-workers)", group=JOB_ARRAY, type=non_negative_int, metavar="I"
    )
    num_workers: int | None = option(
        None, "how many array workers share the build", group=JOB_ARRAY, type=positive_int, metavar="N"
    )
    #: Merge the finished parts of a job array (fails naming the missing parts and their workers).
    merge_only: bool = option(
        False, "merge the parts the workers built; fails naming any missing part", group=JOB_ARRAY
    )
