"""What happens when a build folder's bookkeeping was tampered with: a part or stats file linked to
a file outside `--output`, a part replaced or missing a row after its worker wrote it, planted
stats files, parts that are not parquet or have other columns, lock files that are symlinks.

Every merge (an ordinary build, `--merge-only`) merges only regular files inside the output whose
bytes are those their worker recorded; anything else is one line naming the file (and the part's
worker), and the previous merge is left as it was. An ordinary build rebuilds a part whose stats
file it did not write. Nothing is read, locked or created through a symlink.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from builders.engine.errors import run_handled
from builders.launch import add_builder_parser

from helpers import toy_builder
from helpers.build_helpers import error_line, shard_digests

N_ITEMS, PART_SIZE = 40, 4
TRAIN = ".parts/default/train"


def toy_cli(out: Path, *extra: str) -> int:
    parser = argparse.ArgumentParser()
    add_builder_parser(parser, toy_builder)
    return run_handled(
        parser,
        [
            "--output",
            str(out),
            "--n-items",
            str(N_ITEMS),
            "--part-size",
            str(PART_SIZE),
            "--max-error-fraction",
            "0.2",
            *extra,
        ],
    )


def array_build(out: Path, n_workers: int = 3, *extra: str) -> None:
    """Every worker of a job array, without the merge."""
    for worker in range(n_workers):
        assert toy_cli(out, "--worker-index", str(worker), "--num-workers", str(n_workers), *extra) == 0


def nothing_merged(out: Path) -> bool:
    """No shard (nor a temporary one) and no manifest."""
    return not list(out.glob("data/**/*.parquet*")) and not (out / "build_manifest.json").exists()


def stats_path(out: Path, part: int) -> Path:
    return out / f".parts/stats/part-{part:05d}.json"


def train_rows(path: Path) -> int:
    return pq.ParquetFile(path).metadata.num_rows


def record_part(out: Path, part: int, data: bytes, rows: int) -> None:
    """Write `data` as part `part` of default/train and make its stats file agree with it (what a
    planter who rewrites both leaves): only the part's own content is then left to check."""
    (out / TRAIN / f"part-{part:05d}.parquet").write_bytes(data)
    stats = json.loads(stats_path(out, part).read_text())
    stats["rows"]["default/train"] = rows
    stats["part_files"] = {
        **stats.get("part_files", {}),
        "default/train": {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)},
    }
    stats_path(out, part).write_text(json.dumps(stats))


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


@pytest.fixture
def clean(tmp_path) -> dict[str, str]:
    """The shards of an untouched one-process build."""
    assert toy_cli(tmp_path / "clean") == 0
    return shard_digests(tmp_path / "clean")


# ------------------------------------------------------------------------------ holes: outside files


def test_parts_and_stats_linked_outside_the_output_are_never_merged(tmp_path, capsys):
    """Hole: `--merge-only` followed a part symlinked outside --output, and publish sent its rows."""
    elsewhere = tmp_path / "elsewhere"
    array_build(elsewhere, 3, "--version-tag", "outside")
    out = tmp_path / "array"
    array_build(out)
    for rel in (f"{TRAIN}/part-00001.parquet", ".parts/stats/part-00001.json"):
        (out / rel).unlink()
        (out / rel).symlink_to(elsewhere / rel)  # a valid part and stats file, of another build
    capsys.readouterr()
    assert toy_cli(out, "--merge-only") == 2
    line = error_line(capsys)
    assert str(stats_path(out, 1)) in line and "symlink" in line, line
    assert nothing_merged(out)

    # With the stats file in place, the linked part alone is refused, naming it.
    (out / ".parts/stats/part-00001.json").unlink()
    shutil.copy(elsewhere / ".parts/stats/part-00001.json", stats_path(out, 1))
    assert toy_cli(out, "--merge-only") == 2
    line = error_line(capsys)
    assert str(out / TRAIN / "part-00001.parquet") in line and "symlink" in line, line
    assert "part 1, by worker 1 of 3" in line, line
    assert nothing_merged(out)


def test_a_part_replaced_after_it_was_written_is_refused_naming_its_worker(tmp_path, capsys):
    other = tmp_path / "other"
    array_build(other, 3, "--version-tag", "v2")
    out = tmp_path / "array"
    array_build(out)
    part = f"{TRAIN}/part-00004.parquet"
    shutil.copy(other / part, out / part)  # a well-formed part of the same schema, other rows
    capsys.readouterr()
    assert toy_cli(out, "--merge-only") == 2
    line = error_line(capsys)
    assert str(out / part) in line and "part 4, by worker 1 of 3" in line, line
    assert "worker 1 of --num-workers 3" in line, line
    assert nothing_merged(out)


# ------------------------------------------------------------------------ silent: a row gone missing


@pytest.mark.parametrize("merge", ["--merge-only", "ordinary re-run"])
def test_a_part_missing_a_row_is_refused_and_the_previous_merge_is_kept(tmp_path, capsys, merge):
    """Silent: a part missing a row its stats file claims merged without a word (one row fewer)."""
    out = tmp_path / "out"
    if merge == "--merge-only":
        array_build(out)
    else:
        assert toy_cli(out) == 0
        before = {rel: (out / rel).read_bytes() for rel in ["build_manifest.json", "README.md", *shard_digests(out)]}
    path = out / TRAIN / "part-00002.parquet"
    table = pq.read_table(path)
    claimed = json.loads(stats_path(out, 2).read_text())["rows"]["default/train"]
    assert table.num_rows == claimed > 1
    pq.write_table(table.slice(1), path)
    capsys.readouterr()
    if merge == "--merge-only":
        assert toy_cli(out, "--merge-only") == 2
        assert nothing_merged(out)
    else:
        # Another shard size makes the re-run merge again (a finished build has nothing to do).
        assert toy_cli(out, "--max-shard-bytes", "2000") == 2
        assert {rel: (out / rel).read_bytes() for rel in before} == before, "the old merge changed"
        assert not list(out.rglob("*.tmp"))
    line = error_line(capsys)
    assert str(path) in line and "part 2, by worker" in line, line


# ------------------------------------------------------------------- tracebacks: planted stats files


def plant_garbage(path: Path) -> None:
    path.write_bytes(b"\x00\xffnot json at all")


def plant_empty_object(path: Path) -> None:
    path.write_text("{}")


def plant_link_to_passwd(path: Path) -> None:
    path.unlink()
    path.symlink_to("/etc/passwd")


PLANTED = [plant_garbage, plant_empty_object, plant_link_to_passwd]
PLANTED_IDS = ["garbage", "empty object", "symlink to /etc/passwd"]


@pytest.mark.parametrize("plant", PLANTED, ids=PLANTED_IDS)
def test_a_planted_stats_file_stops_merge_only_naming_it_and_its_worker(tmp_path, capsys, plant):
    out = tmp_path / "array"
    array_build(out)
    plant(stats_path(out, 5))
    capsys.readouterr()
    assert toy_cli(out, "--merge-only") == 2
    line = error_line(capsys)
    assert str(stats_path(out, 5)) in line and "worker 2 of --num-workers 3" in line, line
    assert "root:" not in line  # nothing of /etc/passwd
    assert nothing_merged(out)


@pytest.mark.parametrize("plant", PLANTED, ids=PLANTED_IDS)
def test_a_planted_stats_file_is_rebuilt_by_an_ordinary_run(tmp_path, clean, caplog, plant):
    """A build rebuilds the part (its rows come from the inputs: nothing is lost) and says so."""
    out = tmp_path / "out"
    assert toy_cli(out) == 0
    (out / "build_manifest.json").unlink()  # as a kill before the merge leaves it
    plant(stats_path(out, 5))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert toy_cli(out) == 0
    said = [r.getMessage() for r in caplog.records if "built again" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"{stats_path(out, 5)} "), caplog.text
    assert "part 5 is built again" in said[0] and "root:" not in caplog.text
    assert not stats_path(out, 5).is_symlink()
    assert json.loads(stats_path(out, 5).read_text())["part"] == 5
    assert shard_digests(out) == clean


# ----------------------------------------------------- tracebacks: parts that are not the output's


def not_parquet(table: pa.Table) -> tuple[bytes, int]:
    return b"PAR1 this is not a parquet file", table.num_rows


def extra_column(table: pa.Table) -> tuple[bytes, int]:
    return parquet_bytes(table.append_column("secret", pa.array(["x"] * table.num_rows))), table.num_rows


def missing_column(table: pa.Table) -> tuple[bytes, int]:
    return parquet_bytes(table.drop_columns(["caption"])), table.num_rows


@pytest.mark.parametrize(
    "make, problem",
    [
        (not_parquet, "is not a parquet file"),
        (extra_column, "extra: ['secret']"),
        (missing_column, "missing: ['caption']"),
    ],
    ids=["not parquet", "extra column", "missing column"],
)
@pytest.mark.parametrize("stats", ["stats unchanged", "stats rewritten to match"])
def test_a_part_that_is_not_the_outputs_is_one_line(tmp_path, capsys, make, problem, stats):
    out = tmp_path / "array"
    array_build(out)
    path = out / TRAIN / "part-00003.parquet"
    data, rows = make(pq.read_table(path))
    if stats == "stats unchanged":
        path.write_bytes(data)
        problem = "its size or sha256 differs"
    else:
        record_part(out, 3, data, rows)
    capsys.readouterr()
    assert toy_cli(out, "--merge-only") == 2
    line = error_line(capsys)
    assert str(path) in line and problem in line and "part 3, by worker 0 of 3" in line, line
    assert nothing_merged(out)


# ----------------------------------------------------------------- tracebacks: symlinked lock files


@pytest.mark.parametrize("target_exists", [True, False], ids=["to a file", "dangling"])
def test_a_symlinked_lock_file_is_refused_and_never_locked_through(tmp_path, capsys, target_exists):
    outside = tmp_path / "outside.txt"
    if target_exists:
        outside.write_text("keep me")
    out = tmp_path / "out"
    (out / ".parts").mkdir(parents=True)
    (out / ".parts/lock").symlink_to(outside)
    assert toy_cli(out) == 2
    line = error_line(capsys)
    assert str(out / ".parts/lock") in line and "symlink" in line, line
    assert (outside.read_text() == "keep me") if target_exists else not outside.exists()
    assert not (out / ".parts/run.json").exists()


def test_a_symlinked_worker_lock_is_refused_by_the_worker_and_the_merge(tmp_path, capsys):
    outside = tmp_path / "outside.lock"
    out = tmp_path / "array"
    assert toy_cli(out, "--worker-index", "0", "--num-workers", "2") == 0
    (out / ".parts/worker-00001.lock").symlink_to(outside)
    capsys.readouterr()
    assert toy_cli(out, "--worker-index", "1", "--num-workers", "2") == 2
    line = error_line(capsys)
    assert str(out / ".parts/worker-00001.lock") in line and "symlink" in line, line
    assert not outside.exists() and not stats_path(out, 1).exists()
    assert toy_cli(out, "--merge-only") == 2  # it asks whether worker 1 still runs: same line
    assert str(out / ".parts/worker-00001.lock") in error_line(capsys)
    assert not outside.exists() and nothing_merged(out)


def test_a_symlinked_parts_folder_is_refused(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / ".parts").symlink_to(elsewhere)
    assert toy_cli(out) == 2
    line = error_line(capsys)
    assert f"{out / '.parts'} is a symlink" in line, line
    assert not os.listdir(elsewhere)


@pytest.mark.parametrize(
    "mode",
    [[], ["--merge-only"], ["--worker-index", "0", "--num-workers", "2"]],
    ids=["build", "merge-only", "array worker"],
)
def test_an_output_that_is_a_file_is_one_line(tmp_path, capsys, mode):
    target = tmp_path / "a_file"
    target.write_text("x")
    assert toy_cli(target, *mode) == 2
    assert f"--output {target} is a file" in error_line(capsys)
    assert target.read_text() == "x"


def test_an_array_worker_never_cleans_up_or_writes_through_a_linked_parts_folder(tmp_path, capsys):
    """Issue #49: `.parts/default/train` linked to the user's folder holding a file named as a
    part's temporary file. Before, the worker's clean-up deleted it (only the last component was
    checked) and its parts were written into that folder."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "part-00000.parquet.tmp").write_bytes(b"the user's draft")
    out = tmp_path / "array"
    (out / ".parts/default").mkdir(parents=True)
    (out / TRAIN).symlink_to(outside, target_is_directory=True)
    capsys.readouterr()
    code = toy_cli(out, "--worker-index", "0", "--num-workers", "2")
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == {"part-00000.parquet.tmp": b"the user's draft"}
    assert code == 2
    line = error_line(capsys)
    assert f"{out / TRAIN} is a symlink" in line, line
