"""What happens when a build's inputs hold no item at all: an empty or header-only caption-pair
table, a COCO root without images. A build with nothing to build is a mistake (it used to exit 0
with an empty dataset): one line naming the input option, and nothing written — no run
fingerprint that would tie the folder to the empty inputs, no shard, no manifest."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from builders.app.cli import main as cli_main
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture
from builders.engine.errors import run_handled
from builders.launch import add_builder_parser

from helpers import toy_builder
from helpers.build_helpers import error_line, table_images_argv

IMAGE_ARGS = ["--image-size", "64", "--steps", "2", "--candidates", "1", "--candidate-batch", "1"]


def nothing_written(out: Path) -> bool:
    return (
        not (out / ".parts/run.json").exists()
        and not (out / "build_manifest.json").exists()
        and not (out / "data").exists()
        and not (out / ".parts/stats").exists()
    )


@pytest.mark.parametrize("content", ["id\tcaption_0\tcaption_1\n", ""], ids=["header only", "empty"])
def test_an_empty_caption_pair_table_is_one_line_naming_captions_from(tmp_path, tiny_models_dir, capsys, content):
    table = tmp_path / "EMPTY.tsv"
    table.write_text(content, encoding="utf-8")
    out = tmp_path / "out"
    assert cli_main(table_images_argv(table, tiny_models_dir, out, *IMAGE_ARGS)) == 2
    line = error_line(capsys)
    assert f"--captions-from {table} gives no input items" in line, line
    assert nothing_written(out)


def test_a_coco_root_without_images_is_one_line_naming_coco_root(tmp_path, capsys):
    root = write_coco_fixture(tmp_path / "coco", CocoFixtureConfig(n_images=0))
    out = tmp_path / "out"
    assert (
        cli_main(["build", "coco-captions", "--coco-root", str(root), "--splits", "test", "val", "--output", str(out)])
        == 2
    )
    line = error_line(capsys)
    assert f"--coco-root {root}" in line and "gives no input items" in line, line
    assert nothing_written(out)


@pytest.mark.parametrize(
    "mode", [["--worker-index", "0", "--num-workers", "2"], ["--merge-only"]], ids=["array worker", "merge-only"]
)
def test_job_array_runs_with_no_inputs_are_one_line(tmp_path, capsys, mode):
    items = tmp_path / "items.txt"
    items.write_text("")
    out = tmp_path / "out"
    parser = argparse.ArgumentParser()
    add_builder_parser(parser, toy_builder)
    assert run_handled(parser, ["--output", str(out), "--items-from", str(items), *mode]) == 2
    assert f"--items-from {items} gives no input items" in error_line(capsys)
    assert nothing_written(out)
