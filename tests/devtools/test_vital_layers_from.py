"""`build coco-counterfactuals --vital-layers-from JSON` given a hostile or foreign file (issue
#49): each is refused in one line naming the file before any build work starts (no output
folder is made), or, for provenance text, built with that text shown as plain text in the card.
The file is a real measurement of the tiny SD3 (`counterfactory doctor vital-layers`), edited."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from builders.app.cli import main as cli_main
from builders.counterfactuals.generators import GENERATORS, generator_model
from builders.engine.errors import UserFacingError

from helpers.build_helpers import error_line

HOSTILE = "<script>alert(1)</script>\n# Pwned <img src=x onerror=alert(1)>\n## Owned"


@pytest.fixture(scope="module")
def measured(tmp_path_factory, tiny_models_dir) -> dict:
    out = tmp_path_factory.mktemp("measured") / "sd3.json"
    argv = ["doctor", "vital-layers", "--generator", "sd3", "--models", "tiny", "--tiny-models-dir"]
    argv += [str(tiny_models_dir), "--prompts", "a red cat", "--samples", "1", "--steps", "2", "--top", "2"]
    argv += ["--output", str(out)]
    assert cli_main(argv) == 0
    return json.loads(out.read_text())


def _build(tmp_path: Path, tiny: Path, data: dict | str, *extra: str) -> tuple[int, Path]:
    """The build of one caption pair on the tiny SD3 with `data` as its `--vital-layers-from`."""
    given = tmp_path / "vital.json"
    given.write_text(data if isinstance(data, str) else json.dumps(data))
    table = tmp_path / "pairs.tsv"
    table.write_text("9\tTwo dogs sleep on the couch.\tTwo cats sleep on the couch.\n")
    out = tmp_path / "out"
    argv = [
        *("build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(table)),
        *("--models", "tiny", "--tiny-models-dir", str(tiny), "--output", str(out)),
        *("--generator", "sd3", "--image-size", "64", "--steps", "2", "--candidates", "1"),
        *("--vital-layers-from", str(given), *extra),
    ]
    return cli_main(argv), out


def _refused(tmp_path: Path, tiny: Path, data: dict | str, capsys, *extra: str) -> str:
    """The one error line of a refused build; nothing was built (no output folder)."""
    rc, out = _build(tmp_path, tiny, data, *extra)
    line = error_line(capsys)
    assert rc != 0 and not out.exists()
    assert f"--vital-layers-from {tmp_path / 'vital.json'}" in line
    return line


@pytest.mark.e2e
def test_provenance_text_is_plain_text_in_the_card(measured, tmp_path, tiny_models_dir):
    data = json.loads(json.dumps(measured))
    data["provenance"].update(revision=HOSTILE, dino_model=HOSTILE)
    rc, out = _build(tmp_path, tiny_models_dir, data)
    assert rc == 0
    card = (out / "README.md").read_text()
    # Shown as written inside inline code (Markdown and HTML are not read there), on one line.
    assert card.count(f"`{HOSTILE.replace(chr(10), ' ')}`") == 2  # the DINOv2 model and the revision
    outside_code = re.sub(r"(`+)[^`].*?\1", "", card)
    assert "<script" not in outside_code and "<img" not in outside_code
    assert not [line for line in card.splitlines() if line.lstrip().startswith(("# Pwned", "## Owned"))]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"model": "stabilityai/stable-diffusion-3-medium-diffusers", "blocks": 24}, id="hub-model"),
        pytest.param({"blocks": 3}, id="fewer-blocks"),
        pytest.param({"model": "local:sd3-finetuned"}, id="other-local-folder"),
    ],
)
def test_a_measurement_of_another_model_is_refused(measured, tmp_path, tiny_models_dir, capsys, change):
    data = json.loads(json.dumps(measured))
    data["provenance"]["model"] = change.get("model", data["provenance"]["model"])
    if "blocks" in change:
        data["blocks"] = [f"transformer_blocks.{i}" for i in range(change["blocks"])]
        data["vital_layers"] = [0, 1]
    line = _refused(tmp_path, tiny_models_dir, data, capsys)
    tiny = generator_model(GENERATORS["sd3"], "tiny", "", tiny_models_dir)
    assert f"model {data['provenance']['model']} ({len(data['blocks'])} blocks)" in line
    assert f"loads sd3 model local:sd3 ({len(measured['blocks'])} blocks)" in line
    assert f"counterfactory doctor vital-layers --generator sd3 --generator-model {tiny}" in line


def test_a_measurement_that_names_no_model_is_refused(tmp_path, tiny_models_dir, capsys):
    # What the build took before #49 (a list with an empty provenance): no model to check.
    data = {"generator": "sd3", "vital_layers": [0, 1], "provenance": {}}
    line = _refused(tmp_path, tiny_models_dir, data, capsys)
    assert "records no measured model" in line and "--generator-model" in line


def test_hub_ids_match_in_any_case_and_another_revision_is_only_warned_about(caplog):
    from builders.counterfactuals.vital_layers_file import check_identity

    recorded = {"generator": "flux", "model": "black-forest-labs/FLUX.1-dev", "blocks": ["b"], "revision": "a1"}
    loaded = {**recorded, "model": "Black-Forest-Labs/flux.1-DEV", "revision": "b2"}
    check_identity("v.json", recorded, loaded, "Black-Forest-Labs/flux.1-DEV")
    assert 'measured on "black-forest-labs/FLUX.1-dev" revision "a1", this build loads "b2"' in caplog.text
    with pytest.raises(UserFacingError, match="model differs"):
        check_identity("v.json", recorded, {**loaded, "model": "black-forest-labs/FLUX.1-schnell"}, "x")
    with pytest.raises(UserFacingError, match="model differs"):  # local folders: their names as they are
        check_identity("v.json", {**recorded, "model": "local:Flux"}, {**loaded, "model": "local:flux"}, "x")


@pytest.mark.parametrize(
    "layers, wrong",
    [
        pytest.param([True, 1, 1, 0], "holds true", id="bool"),
        pytest.param([1, 1, 0], "block 1 more than once", id="duplicate"),
        pytest.param([0, 99], "holds 99, not a block index 0..", id="past-the-last-block"),
        pytest.param([0, -1], "holds -1", id="negative"),
        pytest.param([0] * 100_000, "block 0 more than once", id="100k-entries"),
    ],
)
def test_layers_are_distinct_block_indices_of_the_model(measured, tmp_path, tiny_models_dir, capsys, layers, wrong):
    line = _refused(tmp_path, tiny_models_dir, {**measured, "vital_layers": layers}, capsys)
    assert "`vital_layers`" in line and wrong in line


def test_a_file_larger_than_a_measurement_is_refused_before_parsing(measured, tmp_path, tiny_models_dir, capsys):
    # 10^6 entries: 3 MB, a 23 MB card before #49.
    line = _refused(tmp_path, tiny_models_dir, {**measured, "vital_layers": [0] * 1_000_000}, capsys)
    assert "larger than 1024 KiB" in line


@pytest.mark.parametrize(
    "text, wrong",
    [
        pytest.param("[" * 100_000 + "]" * 100_000, "nests deeper than 8 levels", id="100k-deep"),
        pytest.param("nested", "nests deeper than 8 levels", id="20-deep-in-provenance"),
        pytest.param("long", "a string of 500,000 characters", id="long-provenance-string"),
    ],
)
def test_deep_or_long_files_are_refused_in_one_line(measured, tmp_path, tiny_models_dir, capsys, text, wrong):
    data = json.loads(json.dumps(measured))
    if text == "nested":
        data["provenance"]["extra"] = json.loads("[" * 20 + "]" * 20)
    elif text == "long":
        data["provenance"]["method"] = "x" * 500_000  # under the size limit, still no card's text
    else:
        data["vital_layers"] = "@"
    body = json.dumps(data).replace('"@"', text)
    assert wrong in _refused(tmp_path, tiny_models_dir, body, capsys)


def test_a_local_copy_under_another_name_needs_its_own_measurement(measured, tmp_path, tiny_models_dir, capsys):
    copy = tmp_path / "sd3-copy"
    shutil.copytree(generator_model(GENERATORS["sd3"], "tiny", "", tiny_models_dir), copy)
    line = _refused(tmp_path, tiny_models_dir, measured, capsys, "--generator-model", str(copy))
    assert "loads sd3 model local:sd3-copy" in line and f"--generator-model {copy}" in line


def test_a_model_folder_that_is_not_there_is_named(measured, tmp_path, tiny_models_dir, capsys):
    missing = tmp_path / "no-such-model"
    line = _refused(tmp_path, tiny_models_dir, measured, capsys, "--generator-model", str(missing))
    assert f"the transformer config of {missing} is unreadable ({missing} is not a model folder)" in line


def test_a_measurement_of_a_model_with_another_config_is_refused(measured, tmp_path, tiny_models_dir, capsys):
    # Same folder name (local:sd3) and same blocks, another transformer config: before the config
    # hash, only the folder's digest told them apart, and that is only warned about.
    copy = tmp_path / "elsewhere" / "sd3"
    shutil.copytree(generator_model(GENERATORS["sd3"], "tiny", "", tiny_models_dir), copy)
    config_file = copy / "transformer" / "config.json"
    config = json.loads(config_file.read_text())
    config["sample_size"] = config["sample_size"] * 2
    config_file.write_text(json.dumps(config))
    line = _refused(tmp_path, tiny_models_dir, measured, capsys, "--generator-model", str(copy))
    assert "but this build loads sd3 model local:sd3" in line and "(config_sha256 differs)" in line


def test_the_json_records_the_models_config_hash(measured, tiny_models_dir):
    import hashlib

    folder = Path(generator_model(GENERATORS["sd3"], "tiny", "", tiny_models_dir))
    config = json.loads((folder / "transformer" / "config.json").read_text())
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    assert measured["provenance"]["config_sha256"] == hashlib.sha256(canonical).hexdigest()
    assert len(measured["blocks"]) == config["num_layers"]


#: FLUX.1-dev's transformer/config.json as the Hub has it (the fields block_names and the
#: reference read): 19 double- and 38 single-stream blocks, a guidance embedding.
FLUX_DEV_CONFIG = {
    "_class_name": "FluxTransformer2DModel",
    "attention_head_dim": 128,
    "axes_dims_rope": [16, 56, 56],
    "guidance_embeds": True,
    "in_channels": 64,
    "joint_attention_dim": 4096,
    "num_attention_heads": 24,
    "num_layers": 19,
    "num_single_layers": 38,
    "patch_size": 1,
    "pooled_projection_dim": 768,
}


def test_a_tiny_measurement_is_refused_for_flux_dev(tmp_path, tiny_models_dir, capsys, monkeypatch):
    import huggingface_hub

    out = tmp_path / "tiny-flux.json"
    argv = ["doctor", "vital-layers", "--generator", "flux", "--models", "tiny", "--tiny-models-dir"]
    argv += [str(tiny_models_dir), "--samples", "1", "--steps", "1", "--top", "2", "--output", str(out)]
    assert cli_main(argv) == 0
    # The Hub's FLUX.1-dev config, offline: what the build reads to check the file.
    hub = tmp_path / "hub" / "transformer" / "config.json"
    hub.parent.mkdir(parents=True)
    hub.write_text(json.dumps(FLUX_DEV_CONFIG))

    def download(repo, filename, **_kw):
        if (repo, filename) != ("black-forest-labs/FLUX.1-dev", "transformer/config.json"):
            raise huggingface_hub.errors.LocalEntryNotFoundError(filename)
        return str(hub)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    table = tmp_path / "pairs.tsv"
    table.write_text("9\ta dog\ta cat\n")
    argv = ["build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(table)]
    argv += ["--output", str(tmp_path / "o"), "--generator", "flux"]
    argv += ["--generator-model", "black-forest-labs/FLUX.1-dev", "--vital-layers-from", str(out)]
    assert cli_main(argv) != 0 and not (tmp_path / "o").exists()
    line = error_line(capsys)
    assert (
        "measured flux model local:flux (6 blocks), but this build loads flux model black-forest-labs/FLUX.1-dev"
        in line
    )
    assert "(model, blocks, config_sha256 differ)" in line


def test_the_published_flux_list_on_another_model_says_so(tmp_path, caplog):
    from builders.app.cli import build_parser
    from builders.counterfactuals.builder import from_args

    table = tmp_path / "pairs.tsv"
    table.write_text("9\ta dog\ta cat\n")
    argv = ["build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(table)]
    argv += ["--output", str(tmp_path / "o"), "--generator", "flux"]
    record = from_args(build_parser().parse_args(argv)).info().config["generator"]["vital_layers"]
    said = "measured on black-forest-labs/FLUX.1-dev, applied here to black-forest-labs/FLUX.1-schnell"
    assert said in record["provenance"] and said in caplog.text
    caplog.clear()
    argv += ["--generator-model", "black-forest-labs/FLUX.1-dev"]
    record = from_args(build_parser().parse_args(argv)).info().config["generator"]["vital_layers"]
    assert "measured on this model" in record["provenance"] and "applied here" not in caplog.text
