"""A re-run of a finished build has nothing to do: it says so in one INFO line, reads no input and
rewrites no file. A merged file that went missing or changed, a part rebuilt after the merge, or
a merge interrupted half-way make the re-run merge again, to the same bytes."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from builders.engine.errors import UserFacingError
from builders.engine.sharding import runner
from builders.engine.sharding.runner import BuildRunConfig, run_build
from builders.publishing.card import write_card

from helpers import toy_builder
from helpers.build_helpers import shard_digests

NOTHING = "nothing to do"


class _NoInputs(toy_builder.ToyBuilder):
    """A builder whose inputs are gone: any read of them fails the test."""

    def work_items(self):
        raise AssertionError("the inputs were read")

    def process(self, items):
        raise AssertionError("an item was processed")


def build(out: Path, builder_cls=toy_builder.ToyBuilder, **run):
    run = {"part_size": 4, "max_error_fraction": 0.2, **run}
    return run_build(
        builder_cls(toy_builder.ToyConfig(n_items=40)), BuildRunConfig(output_dir=out, **run), finish=write_card
    )


def mtimes(out: Path) -> dict[str, int]:
    return {p.relative_to(out).as_posix(): p.stat().st_mtime_ns for p in sorted(out.rglob("*")) if p.is_file()}


def published(out: Path) -> dict[str, bytes]:
    """The build's data files and figures, and which cards it has (a merge rewrites the card's and
    manifest's timings and creation time)."""
    return {
        rel: b"" if rel in ("README.md", "build_manifest.json") else (out / rel).read_bytes()
        for rel in mtimes(out)
        if not rel.startswith(".parts")
    }


@pytest.fixture
def finished(tmp_path) -> Path:
    out = tmp_path / "out"
    build(out)
    return out


def test_a_finished_build_rerun_does_nothing_and_reads_no_input(finished, caplog):
    before, manifest = mtimes(finished), json.loads((finished / "build_manifest.json").read_text())
    with caplog.at_level(logging.INFO):
        result = build(finished, _NoInputs)
    assert mtimes(finished) == before, "a file was rewritten"
    assert result.manifest == manifest
    said = [r for r in caplog.records if NOTHING in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO, caplog.text
    assert str(finished) in said[0].getMessage()
    # The job-array merge of a finished build has nothing to do either.
    caplog.clear()
    with caplog.at_level(logging.INFO):
        build(finished, _NoInputs, merge_only=True)
    assert mtimes(finished) == before and NOTHING in caplog.text


def damage_shard(out: Path) -> None:
    shard = next((out / "data").rglob("*.parquet"))
    shard.write_bytes(shard.read_bytes() + b"\0")


def damage_in_place(out: Path) -> None:
    """Same size, written after the merge: only its mtime tells."""
    shard = next((out / "data").rglob("*.parquet"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    merged = (out / "build_manifest.json").stat().st_mtime_ns
    os.utime(shard, ns=(merged + 10**9, merged + 10**9))  # later, whatever the clock's granularity


@pytest.mark.parametrize(
    "damage",
    [
        lambda out: next((out / "data").rglob("*.parquet")).unlink(),
        damage_shard,
        damage_in_place,
        lambda out: next((out / "figures").iterdir()).unlink(),
        lambda out: (out / "README.md").unlink(),
        lambda out: (out / "build_manifest.json").write_text("{not json"),
    ],
    ids=[
        "shard deleted",
        "shard grown",
        "shard edited in place",
        "figure deleted",
        "card deleted",
        "manifest damaged",
    ],
)
def test_a_damaged_build_is_merged_again(finished, damage, caplog):
    want = published(finished)
    damage(finished)
    with caplog.at_level(logging.INFO):
        build(finished)
    assert NOTHING not in caplog.text
    assert published(finished) == want
    caplog.clear()
    with caplog.at_level(logging.INFO):
        build(finished, _NoInputs)  # and now it is finished again
    assert NOTHING in caplog.text


def test_a_merge_interrupted_half_way_is_completed(finished):
    want = published(finished)

    def card_fails(*args):
        raise KeyboardInterrupt  # killed after the shards were replaced, before the manifest

    with pytest.raises(KeyboardInterrupt):
        run_build(
            toy_builder.ToyBuilder(toy_builder.ToyConfig(n_items=40)),
            BuildRunConfig(output_dir=finished, part_size=4, max_error_fraction=0.2, max_shard_bytes=2000),
            finish=card_fails,
        )
    assert not (finished / "build_manifest.json").exists()
    build(finished)
    assert published(finished) == want
    assert (
        json.loads((finished / "build_manifest.json").read_text())["run"]["max_shard_bytes"]
        == BuildRunConfig(output_dir=finished).max_shard_bytes
    )


def test_parts_rebuilt_after_the_merge_are_merged(finished, monkeypatch, caplog):
    # --retry-errors rebuilds the parts that recorded errors, then is killed before its merge.
    monkeypatch.setattr(runner, "merge_parts", lambda **kw: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        build(finished, retry_errors=True)
    assert not (finished / "build_manifest.json").exists(), "the old merge no longer matches"
    monkeypatch.undo()
    with caplog.at_level(logging.INFO):
        build(finished)
    assert NOTHING not in caplog.text and (finished / "build_manifest.json").is_file()

    # A part that is unfinished again (its stats gone) is rebuilt and merged.
    (finished / ".parts/stats/part-00003.json").unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        build(finished)
    assert NOTHING not in caplog.text and (finished / ".parts/stats/part-00003.json").is_file()


def test_settings_that_change_the_merge_or_its_verdict_are_not_skipped(finished):
    build(finished, max_shard_bytes=2000)
    assert len(shard_digests(finished)) > 3, "the shards were cut again at the new size"
    with pytest.raises(UserFacingError, match="more than --max-error-fraction 0.01"):
        build(finished, _NoInputs, max_shard_bytes=2000, max_error_fraction=0.01)
