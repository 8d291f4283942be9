"""Job arrays: workers that build their parts without rendezvous, then one `--merge-only` run.

Each worker builds the parts k with k % N == I (the same rule as the ranks of `accelerate launch`)
and exits without merging; the merge writes shards identical to a one-process build, or names
the missing parts and the worker that builds each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builders.app.cli import main as cli_main
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture
from builders.engine.distributed import array_worker
from builders.engine.errors import UserFacingError, run_handled
from builders.engine.sharding.layout import OutputLayout
from builders.engine.sharding.output_guard import worker_lock
from builders.engine.sharding.runner import BuildRunConfig, run_build
from builders.publishing.card import write_card

from helpers import toy_builder
from helpers.build_helpers import captions_build, kill_after_parts, shard_digests

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

TOY = Path(__file__).parents[1] / "helpers" / "toy_builder.py"
SLURM = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_COUNT")


@pytest.fixture(autouse=True)
def _no_slurm(monkeypatch):
    """The tests may run inside a SLURM job array: only the SLURM test sets its variables."""
    for name in SLURM:
        monkeypatch.delenv(name, raising=False)


def toy_run(out: Path, **run) -> object:
    builder = toy_builder.ToyBuilder(toy_builder.ToyConfig(n_items=40))
    cfg = BuildRunConfig(output_dir=out, part_size=4, max_error_fraction=0.2, **run)
    return run_build(builder, cfg, finish=write_card)


def toy_cmd(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(TOY),
        "--output",
        str(out),
        "--n-items",
        "40",
        "--part-size",
        "4",
        "--max-error-fraction",
        "0.2",
        *extra,
    ]


def toy_cli(out: Path, *extra: str) -> int:
    parser = __import__("argparse").ArgumentParser()
    from builders.launch import add_builder_parser

    add_builder_parser(parser, toy_builder)
    return run_handled(
        parser, ["--output", str(out), "--n-items", "40", "--part-size", "4", "--max-error-fraction", "0.2", *extra]
    )


@pytest.fixture
def single(tmp_path) -> dict[str, str]:
    toy_run(tmp_path / "single")
    return shard_digests(tmp_path / "single")


def test_three_concurrent_workers_then_merge_equal_one_process(tmp_path, single):
    out = tmp_path / "array"
    # Started at once on one folder: they must agree on one run.json and write disjoint parts.
    procs = [
        subprocess.Popen(
            toy_cmd(out, "--worker-index", str(i), "--num-workers", "3"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(3)
    ]
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stdout.read()[-3000:]
    assert not (out / "data").exists() and not (out / "build_manifest.json").exists()
    stats = [json.loads(p.read_text()) for p in sorted((out / ".parts/stats").glob("*.json"))]
    assert [(s["part"], s["rank"], s["world_size"]) for s in stats] == [(k, k % 3, 3) for k in range(10)]

    result = toy_run(out, merge_only=True)
    assert shard_digests(out) == single
    assert result.manifest["run"]["processes"] == 3


def test_a_missing_part_is_named_with_its_worker(tmp_path, single, capsys):
    out = tmp_path / "array"
    for worker in (0, 2):
        assert toy_run(out, worker_index=worker, num_workers=3) is None
    assert toy_cli(out, "--merge-only") == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert len(err) == 1, err
    assert "3 of 10 parts" in err[0] and "part 1 (worker 1), part 4 (worker 1), part 7 (worker 1)" in err[0], err[0]
    assert not (out / "data").exists()

    assert toy_cli(out, "--worker-index", "1", "--num-workers", "3") == 0
    assert toy_cli(out, "--merge-only") == 0
    assert shard_digests(out) == single


def test_a_killed_worker_rerun_completes_the_same_shards(tmp_path, single):
    out = tmp_path / "array"
    finished = kill_after_parts(
        toy_cmd(out, "--worker-index", "0", "--num-workers", "2", "--sleep", "0.15"),
        out / ".parts/stats",
        min_parts=2,
        timeout=120,
        poll=0.05,
    )
    assert 2 <= finished < 5, "the kill must land mid-way through worker 0's five parts"
    # The killed worker left its lock file behind: the lock (not the file) is what counts.
    assert toy_run(out, worker_index=1, num_workers=2) is None
    with pytest.raises(UserFacingError, match=r"part \d+ \(worker 0\)"):
        toy_run(out, merge_only=True)
    done = subprocess.run(
        toy_cmd(out, "--worker-index", "0", "--num-workers", "2"), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "already finished" in done.stderr
    toy_run(out, merge_only=True)
    assert shard_digests(out) == single


def test_slurm_array_variables_choose_the_worker(tmp_path, single, monkeypatch):
    env = {"SLURM_ARRAY_TASK_MIN": "4", "SLURM_ARRAY_TASK_COUNT": "3"}
    assert array_worker(None, None, {**env, "SLURM_ARRAY_TASK_ID": "5"}) == (1, 3)
    assert array_worker(2, 3, {**env, "SLURM_ARRAY_TASK_ID": "5"}) == (2, 3), "flags win"
    assert array_worker(None, None, {}) is None
    with pytest.raises(UserFacingError, match="not in 0..2"):
        array_worker(None, None, {**env, "SLURM_ARRAY_TASK_ID": "9"})
    with pytest.raises(UserFacingError, match="SLURM_ARRAY_TASK_COUNT"):
        array_worker(None, None, {"SLURM_ARRAY_TASK_ID": "1"})
    with pytest.raises(UserFacingError, match="go together"):
        array_worker(1, None, {})

    out = tmp_path / "array"
    for task in (4, 5, 6):
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", str(task))
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert toy_cli(out) == 0
    assert not (out / "data").exists()
    ranks = {json.loads(p.read_text())["rank"] for p in (out / ".parts/stats").glob("*.json")}
    assert ranks == {0, 1, 2}
    # The merge runs as an ordinary (dependent) job, outside the array.
    for name in SLURM:
        monkeypatch.delenv(name)
    assert toy_cli(out, "--merge-only") == 0
    assert shard_digests(out) == single


def test_merge_waits_for_running_workers_and_overwrite_is_refused(tmp_path):
    out = tmp_path / "array"
    toy_run(out, worker_index=0, num_workers=2)
    with worker_lock(OutputLayout(out), 1):
        with pytest.raises(UserFacingError, match=r"worker\(s\) 1 are still writing"):
            toy_run(out, merge_only=True)
        with pytest.raises(UserFacingError, match="still writing"):
            toy_run(out)
    with pytest.raises(UserFacingError, match="--overwrite cannot be used"):
        toy_run(out, worker_index=1, num_workers=2, overwrite=True)
    with pytest.raises(UserFacingError, match="different configuration"):
        run_build(
            toy_builder.ToyBuilder(toy_builder.ToyConfig(n_items=41)),
            BuildRunConfig(output_dir=out, part_size=4, worker_index=1, num_workers=2),
        )


def test_coco_captions_workers_then_merge_equal_one_process(tmp_path):
    root = write_coco_fixture(tmp_path / "coco", CocoFixtureConfig(n_images=8))
    assert captions_build(root, tmp_path / "single") == 0
    out = tmp_path / "array"
    args = [
        "build",
        "coco-captions",
        "--coco-root",
        str(root),
        "--splits",
        "test",
        "val",
        "--output",
        str(out),
        "--part-size",
        "2",
        "--max-error-fraction",
        "0.5",
    ]
    for worker in range(3):
        assert cli_main([*args, "--worker-index", str(worker), "--num-workers", "3"]) == 0
    assert not (out / "data").exists()
    assert cli_main([*args, "--merge-only"]) == 0
    assert shard_digests(out) == shard_digests(tmp_path / "single")
    assert os.listdir(out / "data")
