"""`counterfactory renderings` given builds whose `build_manifest.json` was edited into another
shape (#41): a field that a build writes as an object or a string, given as a list or a string,
is one line naming the manifest and the field, and the output folder is not created. Hand-made
manifests: the check runs before any shard is read, so no build is needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builders.app.cli import main as cli_main

from helpers.build_helpers import error_line

#: The config fields `renderings` reads from a one-generator image-stage build's manifest.
CONFIG = {
    "stage": "images",
    "split": "test",
    "images": {"generator": "sd15", "steps": 2, "image_size": 64},
    "generator": {"name": "sd15", "method": "prompt-to-prompt", "license": "openrail", "default_model": "m"},
}
#: Its `default/test` output: no rows.
OUTPUT = {"config": "default", "split": "test", "rows": 0, "data_dir": "data", "shards": [], "features": {}}


def build_folder(folder: Path, config, output=OUTPUT) -> Path:
    folder.mkdir(parents=True)
    manifest = {"builder": "coco-counterfactuals", "models": {}, "config": config, "files": []}
    (folder / "build_manifest.json").write_text(json.dumps({**manifest, "outputs": {"default/test": output}}))
    return folder


def sdxl(config=CONFIG) -> dict:
    """`config` of the other generator's build."""
    return {
        **config,
        "images": {**config["images"], "generator": "sdxl"},
        "generator": {**config["generator"], "name": "sdxl"},
    }


@pytest.mark.parametrize(
    "config, output, field",
    [
        # The three cases of #41: a TypeError or AttributeError from the generator check.
        ({**CONFIG, "images": {**CONFIG["images"], "generator": ["sd15"]}}, OUTPUT, "config.images.generator is list"),
        ({**CONFIG, "images": "sd15"}, OUTPUT, "config.images is str"),
        ([CONFIG], OUTPUT, "config is list"),
        # Read further on: a TypeError naming the table, a KeyError planning the copies.
        ({**CONFIG, "captions_table": {"files": ["a.parquet"]}}, OUTPUT, "config.captions_table.files is list"),
        (CONFIG, {k: v for k, v in OUTPUT.items() if k != "shards"}, "outputs.default/test.shards is NoneType"),
    ],
)
def test_a_manifest_field_of_another_shape_is_one_line_naming_the_manifest(config, output, field, tmp_path, capsys):
    edited = build_folder(tmp_path / "edited", config, output)
    other = build_folder(tmp_path / "other", sdxl())
    out = tmp_path / "out"
    assert cli_main(["renderings", "--output", str(out), str(edited), str(other)]) == 2
    line = error_line(capsys)
    assert f"{edited / 'build_manifest.json'} is damaged" in line and field in line, line
    assert not out.exists()


def test_the_hand_made_manifest_is_read_past_its_shape(tmp_path, capsys):
    """The same manifests with fields of the right shape reach the next check (the generator's
    record), so the cases above are refused for their shape alone."""
    edited = build_folder(tmp_path / "edited", {**CONFIG, "generator": {**CONFIG["generator"], "name": "sdxl"}})
    other = build_folder(tmp_path / "other", sdxl())
    assert cli_main(["renderings", "--output", str(tmp_path / "out"), str(edited), str(other)]) == 2
    line = error_line(capsys)
    assert "records no generator of this counterfactory" in line and "damaged" not in line, line
