"""The sharded runner: layout, determinism, resume, failure policy, multi-process builds."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from datasets import load_dataset

from builders.engine.errors import run_handled
from builders.engine.errors import UserFacingError
from builders.engine.sharding.runner import BuildRunConfig, run_build
from builders.publishing.card import write_card

from helpers import toy_builder
from helpers.build_helpers import accelerate_cmd, kill_after_parts, shard_digests

TOY = Path(__file__).parents[1] / "helpers" / "toy_builder.py"


def expected_rows(n_items: int, tag: str = "v1") -> dict[str, list[int]]:
    """The toy's rules, restated independently of the runner: which ids land in which split."""
    kept = [i for i in range(n_items) if i % 7 != 3 and i % 11 != 5]
    return {"train": [i for i in kept if i % 5], "test": [i for i in kept if i % 5 == 0]}


def build(out: Path, n_items: int = 40, part_size: int = 8, **run) -> dict:
    builder = toy_builder.ToyBuilder(toy_builder.ToyConfig(n_items=n_items))
    cfg = BuildRunConfig(output_dir=out, part_size=part_size, max_error_fraction=0.2, **run)
    return run_build(builder, cfg, finish=write_card).manifest


def test_build_loads_with_load_dataset_and_counts_reasons(tmp_path):
    manifest = build(tmp_path / "out")
    ds = load_dataset(str(tmp_path / "out"))
    want = expected_rows(40)
    assert ds["train"]["id"] == want["train"] and ds["test"]["id"] == want["test"]
    img = ds["train"][0]["image"]
    assert img.size == (8, 8) and img.mode == "RGB"
    # Images are embedded bytes, not paths to files on the build machine.
    table = pq.read_table(next((tmp_path / "out/data").glob("train-*.parquet")))
    assert all(v["bytes"] and v["path"] is None for v in table.column("image").to_pylist())
    captions = load_dataset(str(tmp_path / "out"), "captions", split="train")
    assert captions["id"] == sorted(want["train"] + want["test"])
    assert manifest["skipped"] == {"seven_three": sum(1 for i in range(40) if i % 7 == 3)}
    assert manifest["errors"] == {"bad_input": sum(1 for i in range(40) if i % 11 == 5 and i % 7 != 3)}
    stats = json.loads((tmp_path / "out/.parts/stats/part-00000.json").read_text())
    assert stats["items"] == 8 and set(stats["timings"]) == {"process_s", "write_s"}


def test_same_config_gives_byte_identical_shards_and_part_size_changes_nothing_loaded(tmp_path):
    build(tmp_path / "a")
    build(tmp_path / "b")
    assert shard_digests(tmp_path / "a") == shard_digests(tmp_path / "b")
    build(tmp_path / "c", part_size=3)
    assert (
        load_dataset(str(tmp_path / "c"))["train"]["caption"] == load_dataset(str(tmp_path / "a"))["train"]["caption"]
    )


def test_resume_redoes_only_unfinished_parts(tmp_path):
    out = tmp_path / "out"
    build(out)
    reference = shard_digests(out)
    # Simulate a crash: part 2 lost its stats (unfinished) and left a truncated part file.
    (out / ".parts/stats/part-00002.json").unlink()
    part = out / ".parts/default/train/part-00002.parquet"
    part.write_bytes(part.read_bytes()[:50])
    mtime_part0 = (out / ".parts/stats/part-00000.json").stat().st_mtime_ns
    build(out)
    assert shard_digests(out) == reference
    assert (out / ".parts/stats/part-00000.json").stat().st_mtime_ns == mtime_part0


def test_different_config_in_same_folder_is_refused(tmp_path):
    build(tmp_path / "out")
    with pytest.raises(UserFacingError, match="different configuration"):
        build(tmp_path / "out", n_items=41)


def test_mostly_failing_run_fails_loudly_and_keeps_parts(tmp_path):
    builder = toy_builder.ToyBuilder(toy_builder.ToyConfig(n_items=40))
    with pytest.raises(UserFacingError, match="failed on bad input"):
        run_build(
            builder,
            BuildRunConfig(output_dir=tmp_path / "out", part_size=8, max_error_fraction=0.01),
            finish=write_card,
        )
    assert len(list((tmp_path / "out/.parts/stats").glob("*.json"))) == 5


def test_small_shard_size_splits_into_numbered_shards(tmp_path):
    build(tmp_path / "out", max_shard_bytes=2_000)
    names = sorted(p.name for p in (tmp_path / "out/data").glob("train-*.parquet"))
    assert len(names) > 1 and names[0].endswith(f"-of-{len(names):05d}.parquet")
    assert load_dataset(str(tmp_path / "out"), split="train")["id"] == expected_rows(40)["train"]


def test_cli_entry_point_reports_user_errors_in_one_line(tmp_path, capsys):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk/file.txt").write_text("not a build")
    parser = __import__("argparse").ArgumentParser()
    from builders.launch import add_builder_parser

    add_builder_parser(parser, toy_builder)
    assert run_handled(parser, ["--output", str(tmp_path / "junk")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tmp_path / "junk") in err[0]


def _accelerate_cmd(out: Path, *extra: str) -> list[str]:
    return accelerate_cmd(
        TOY,
        "--output",
        str(out),
        "--n-items",
        "40",
        "--part-size",
        "4",
        "--max-error-fraction",
        "0.2",
        "--expect-processes",
        "2",
        *extra,
    )


@pytest.mark.e2e
@pytest.mark.accelerate
def test_two_processes_killed_and_resumed_equal_a_single_process_run(tmp_path):
    single = tmp_path / "single"
    build(single, part_size=4)
    out = tmp_path / "multi"
    stats_dir = out / ".parts/stats"
    finished = kill_after_parts(_accelerate_cmd(out, "--sleep", "0.15"), stats_dir, min_parts=3, timeout=120, poll=0.1)
    assert 3 <= finished < 10, "the kill must land mid-way"
    assert not (out / "data").exists()

    done = subprocess.run(_accelerate_cmd(out), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "already finished" in done.stderr
    ranks = {json.loads(p.read_text())["rank"] for p in stats_dir.glob("*.json")}
    assert ranks == {0, 1}, "both processes must have built parts"
    assert shard_digests(out) == shard_digests(single)
    multi_rows = load_dataset(str(out), split="train")["id"]
    assert multi_rows == expected_rows(40)["train"] and len(set(multi_rows)) == len(multi_rows)


class _NoTestRows(toy_builder.ToyBuilder):
    def process(self, items):
        for out in super().process(items):
            if not getattr(out, "output", "").startswith("default/test"):
                yield out


def test_empty_output_is_left_out_of_configs_and_the_rest_loads(tmp_path):
    out = tmp_path / "b"
    builder = _NoTestRows(toy_builder.ToyConfig(n_items=20))
    manifest = run_build(
        builder, BuildRunConfig(output_dir=out, part_size=8, max_error_fraction=0.2), finish=write_card
    ).manifest
    assert manifest["outputs"]["default/test"]["rows"] == 0
    assert not list((out / "data").glob("test-*"))
    assert "split: test" not in (out / "README.md").read_text()
    assert sorted(load_dataset(str(out), split="train")["id"]) == expected_rows(20)["train"]
    with pytest.raises(ValueError, match="test"):
        load_dataset(str(out), split="test")
