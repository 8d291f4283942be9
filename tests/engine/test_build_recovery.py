"""What happens when a build is interrupted, resumed on changed inputs, run twice at once, or
cannot write its output: never a mix of sources, always one clear line, nothing left behind."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from builders.app.cli import main as cli_main
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture
from builders.engine.sharding.layout import OutputLayout
from builders.engine.sharding.up_to_date import invalidate

from helpers.build_helpers import error_line, shard_digests
from helpers.eccv_fixtures import package_json, write_test_image_root

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

TOY = Path(__file__).parents[1] / "helpers" / "toy_builder.py"


def build(root: Path, out: Path, *extra: str) -> int:
    return cli_main(
        [
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
            "1",
            *extra,
        ]
    )


def crash_after(out: Path, finished: int) -> None:
    """What a kill leaves behind: parts past `finished` without stats, no merged output (the
    manifest removed as a run removes it before building a part: its files stay listed)."""
    for stats in sorted((out / ".parts/stats").glob("part-*.json"))[finished:]:
        stats.unlink()
    shutil.rmtree(out / "data")
    invalidate(OutputLayout(out))


@pytest.fixture
def coco(tmp_path) -> Path:
    return write_coco_fixture(tmp_path / "coco", CocoFixtureConfig(n_images=8))


def items_in_order(out: Path) -> list[int]:
    return [
        row["image_id"]
        for p in sorted((out / "data").glob("test-*.parquet"))
        for row in pq.read_table(p, columns=["image_id"]).to_pylist()
    ]


def edit_caption(root: Path, image_id: int, text: str) -> None:
    for path in (root / "annotations").glob("captions_*.json"):
        data = json.loads(path.read_text())
        for ann in data["annotations"]:
            if ann["image_id"] == image_id:
                ann["caption"] = text
                path.write_text(json.dumps(data))
                return


def test_resume_on_changed_inputs_is_refused_naming_the_change(coco, tmp_path, capsys):
    out = tmp_path / "out"
    assert build(coco, out) == 0
    first, second = items_in_order(out)[:2]
    crash_after(out, finished=2)

    # A caption of a finished part changed: resuming would mix old and new sources.
    captions = coco / "annotations/captions_val2014.json"
    original = captions.read_bytes()
    edit_caption(coco, first, "a completely different caption")
    capsys.readouterr()
    assert build(coco, out) == 2
    line = error_line(capsys)
    assert "changed since its parts were built" in line and f"part 0: image id {first}" in line
    assert "part 1" not in line and not (out / "data").exists()

    # An image file of a finished part was replaced (size/mtime differ): named by its path.
    captions.write_bytes(original)
    image = next(coco.rglob(f"*{second:012d}.jpg"))
    image.write_bytes(image.read_bytes() + b"\0")
    assert build(coco, out) == 2
    line = error_line(capsys)
    assert f"part 1: image id {second} ({image})" in line and "part 0" not in line

    # --overwrite rebuilds from the current inputs: equal to a clean build of them.
    assert build(coco, out, "--overwrite") == 0
    assert build(coco, tmp_path / "fresh") == 0
    assert shard_digests(out) == shard_digests(tmp_path / "fresh")


def test_changes_only_in_unbuilt_parts_resume_to_a_clean_build_of_the_new_inputs(coco, tmp_path):
    out = tmp_path / "out"
    assert build(coco, out) == 0
    ids = items_in_order(out)
    crash_after(out, finished=1)
    edit_caption(coco, ids[-1], "a cat sits next to a red umbrella")
    assert build(coco, out) == 0
    assert build(coco, tmp_path / "fresh") == 0
    assert shard_digests(out) == shard_digests(tmp_path / "fresh")


def test_eccv_resume_on_a_changed_coco_root_is_refused_naming_the_query(tmp_path, capsys):
    """eccv-positives rows read captions, image files and instances of several COCO records:
    each work item carries them, so a resume on a changed COCO root is refused too."""
    eccv, coco_i2t = package_json("eccv", "i2t"), package_json("coco", "i2t")
    # ECCV image queries one of whose own captions is an ECCV positive (its text is in the row).
    queries = [i for i in sorted(eccv) if set(eccv[i]) & set(coco_i2t[i])]
    images = random.Random(7).sample(queries, 4)
    # Two pairs of PM matches (same classes): swapping two images' classes keeps every PM query.
    root = write_test_image_root(tmp_path / "coco", dict(zip(images, ([1], [1], [2], [2]), strict=True)))
    target = images[0]
    caption = next(c for c in eccv[target] if c in coco_i2t[target])
    out = tmp_path / "out"

    def build_eccv(dest: Path = out) -> int:
        # 2000 items a part: parts 0-2 hold the 5,000 image queries, the last one PM and `removed`.
        return cli_main(
            ["build", "eccv-positives", "--coco-root", str(root), "--output", str(dest), "--part-size", "2000"]
        )

    assert build_eccv() == 0
    crash_after(out, finished=3)
    captions = root / "annotations/captions_val2014.json"
    original = captions.read_bytes()
    data = json.loads(original)
    next(a for a in data["annotations"] if a["id"] == caption)["caption"] = "a changed caption"
    captions.write_text(json.dumps(data))
    capsys.readouterr()
    assert build_eccv() == 2
    line = error_line(capsys)
    image = root / f"val2014/COCO_val2014_{target:012d}.jpg"
    assert "changed since its parts were built" in line and f"image id {target} ({image})" in line
    assert not (out / "data").exists()

    # Instance classes: PM rows (in the last part) change when two images swap classes, with
    # the same PM queries as before (the same items, were items only ids).
    captions.write_bytes(original)
    assert build_eccv() == 0  # restored: the resume goes on
    stats = sorted((out / ".parts/stats").glob("part-*.json"))
    stats[0].unlink()  # a crash of another process: only part 0 unfinished
    shutil.rmtree(out / "data")
    invalidate(OutputLayout(out))
    instances = root / "annotations/instances_val2014.json"
    data = json.loads(instances.read_text())
    for ann in data["annotations"]:
        ann["category_id"] = {images[0]: 2, images[2]: 1}.get(ann["image_id"], ann["category_id"])
    instances.write_text(json.dumps(data))
    assert build_eccv() == 2
    line = error_line(capsys)
    assert f"part {len(stats) - 1}: pm i2t query {min(images)}" in line and "part 0" not in line

    # --overwrite rebuilds from the current inputs: equal to a clean build of them.
    assert (
        cli_main(
            [
                "build",
                "eccv-positives",
                "--coco-root",
                str(root),
                "--output",
                str(out),
                "--part-size",
                "2000",
                "--overwrite",
            ]
        )
        == 0
    )
    assert build_eccv(tmp_path / "fresh") == 0
    assert shard_digests(out) == shard_digests(tmp_path / "fresh")


def test_overwrite_and_the_merge_delete_only_the_files_the_build_lists(coco, tmp_path, capsys):
    """#41 §1: a user's file beside a build (`data/extra.parquet`, not in the manifest) and a
    card the user edited are never deleted: `--overwrite` on changed inputs refuses them by name,
    deleting nothing; a re-merge leaves the unlisted file in place."""
    out = tmp_path / "out"
    assert build(coco, out) == 0
    extra = out / "data" / "extra.parquet"
    extra.write_bytes(next((out / "data").glob("test-*.parquet")).read_bytes())
    assert build(coco, out, "--overwrite") == 0  # same inputs: merged again, extra left alone
    assert extra.is_file()
    edit_caption(coco, items_in_order(out)[0], "a completely different caption")
    card = out / "README.md"
    card.write_text(card.read_text() + "my notes\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and ".parts" not in p.parts}
    capsys.readouterr()
    assert build(coco, out, "--overwrite") == 2
    line = error_line(capsys)
    assert "data/extra.parquet (not listed)" in line and "README.md (changed since it was written)" in line
    assert "nothing was deleted" in line
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and ".parts" not in p.parts} == before
    extra.unlink()
    card.unlink()
    assert build(coco, out, "--overwrite") == 0  # the build's own files only: discarded, rebuilt
    assert build(coco, tmp_path / "fresh") == 0
    assert shard_digests(out) == shard_digests(tmp_path / "fresh")


def test_fixing_a_bad_image_and_retrying_errors_is_allowed(coco, tmp_path):
    out = tmp_path / "out"
    image = next(coco.rglob("*.jpg"))
    good = image.read_bytes()
    image.write_bytes(b"broken")
    assert build(coco, out, "--max-error-fraction", "0.5") == 0
    image.write_bytes(good)  # the fix changes the input of a part that recorded the error
    assert build(coco, out, "--max-error-fraction", "0.5", "--retry-errors") == 0
    manifest = json.loads((out / "build_manifest.json").read_text())
    assert manifest["errors"] == {}
    assert build(coco, tmp_path / "fresh") == 0
    assert shard_digests(out) == shard_digests(tmp_path / "fresh")


def test_a_failed_read_leaves_nothing_that_blocks_the_corrected_rerun(coco, tmp_path, capsys):
    out = tmp_path / "out"
    captions = coco / "annotations/captions_val2014.json"
    saved = captions.read_bytes()
    captions.unlink()
    assert build(coco, out) == 2
    assert "captions file is missing" in error_line(capsys)
    captions.write_bytes(saved)
    assert build(coco, out, "--splits", "test") == 0  # even with another configuration


def test_a_second_build_into_the_same_folder_fails_at_once(tmp_path, capsys):
    out = tmp_path / "out"
    first = subprocess.Popen(
        [
            sys.executable,
            str(TOY),
            "--output",
            str(out),
            "--n-items",
            "40",
            "--part-size",
            "4",
            "--sleep",
            "0.05",
            "--max-error-fraction",
            "0.2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while not list((out / ".parts/stats").glob("*.json")):
            assert first.poll() is None and time.time() < deadline, first.stderr.read()
            time.sleep(0.05)
        parser = __import__("argparse").ArgumentParser()
        from helpers import toy_builder
        from builders.engine.errors import run_handled
        from builders.launch import add_builder_parser

        add_builder_parser(parser, toy_builder)
        capsys.readouterr()
        assert (
            run_handled(
                parser, ["--output", str(out), "--n-items", "40", "--part-size", "4", "--max-error-fraction", "0.2"]
            )
            == 2
        )
        line = error_line(capsys)
        assert "another build is writing to" in line and str(out) in line
        assert first.poll() is None, "refused while the first build was still running"
    finally:
        assert first.wait(timeout=300) == 0, first.stderr.read()
    # The refused build touched nothing: the first one finished normally.
    assert json.loads((out / "build_manifest.json").read_text())["items"] == 40


def test_disk_full_during_the_merge_is_one_line_and_leaves_no_temp_files(coco, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    real = pq.ParquetWriter.write_table

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "data"))

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    assert build(coco, out) == 2
    line = error_line(capsys)
    assert "no space left on the device" in line and "re-run the same command" in line
    assert not list(out.rglob("*.tmp"))
    monkeypatch.setattr(pq.ParquetWriter, "write_table", real)
    assert build(coco, out) == 0
    assert build(coco, tmp_path / "fresh") == 0
    assert shard_digests(out) == shard_digests(tmp_path / "fresh")


def test_leftover_temp_files_of_a_killed_run_are_removed(coco, tmp_path):
    out = tmp_path / "out"
    assert build(coco, out) == 0
    crash_after(out, finished=1)
    (out / "data").mkdir()
    leftovers = [out / "data/test-00000-of-00001.parquet.tmp", out / ".parts/stats/part-00003.json.tmp"]
    for path in leftovers:
        path.write_bytes(b"half written")
    assert build(coco, out) == 0
    assert not list(out.rglob("*.tmp"))


def test_output_that_is_a_file_or_not_writable_is_one_line(coco, tmp_path, capsys, monkeypatch):
    target = tmp_path / "a_file"
    target.write_text("x")
    assert build(coco, target) == 2
    assert f"--output {target} is a file" in error_line(capsys)

    def denied(src, dst, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(dst))

    monkeypatch.setattr(os, "replace", denied)
    assert build(coco, tmp_path / "ro") == 2
    line = error_line(capsys)
    assert "permission denied" in line and str(tmp_path / "ro") in line
