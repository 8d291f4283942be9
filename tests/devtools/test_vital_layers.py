"""`counterfactory doctor vital-layers` (issue #43; builders/devtools/vital_layers.py) on the tiny
random SD3 and FLUX families, end to end: the ranking, the JSON with its provenance, and a build
that takes it (`--vital-layers-from`) recording it in the manifest and card. The tiny rankings
mean nothing (random weights); the real list needs the production weights on a GPU
(builders/counterfactuals/METHOD.md §6 says how)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from builders.app.cli import main as cli_main
from builders.counterfactuals.generators import GENERATORS, generator_model
from builders.counterfactuals.mmdit_edit import vital_layer_map
from builders.devtools.vital_layers import bypassed
from builders.engine.errors import UserFacingError
from builders.models.loaders import load_generator

from helpers.build_helpers import error_line


def _measure(tmp_path: Path, tiny: Path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    argv = ["doctor", "vital-layers", "--generator", name, "--models", "tiny", "--tiny-models-dir", str(tiny)]
    argv += ["--prompts", "a red cat", "a blue bus", "--seeds", "0", "1", "--steps", "2", "--output", str(out)]
    assert cli_main([*argv, *extra]) == 0
    return json.loads(out.read_text())


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_vital_layers_ranks_every_block_and_writes_its_provenance(name, tmp_path, tiny_models_dir, capsys):
    data = _measure(tmp_path, tiny_models_dir, name, "--top", "2")
    config = json.loads(
        (
            Path(generator_model(GENERATORS[name], "tiny", "", tiny_models_dir)) / "transformer" / "config.json"
        ).read_text()
    )
    # Every block once: FLUX's double-stream blocks, then its single-stream ones; SD3's joint blocks.
    expected = [f"transformer_blocks.{i}" for i in range(config["num_layers"])]
    expected += [f"single_transformer_blocks.{i}" for i in range(config.get("num_single_layers", 0))]
    assert data["blocks"] == expected and data["generator"] == name
    sim = np.array(data["similarity"])
    assert sim.shape == (len(expected),) and np.all(np.abs(sim) <= 1 + 1e-9)
    # Bypassing a block changes the image: not every similarity is 1.
    assert sim.min() < 1 - 1e-6
    # The two most vital are the two lowest similarities.
    assert sorted(data["vital_layers"]) == sorted(np.argsort(sim, kind="stable")[:2].tolist())
    prov = data["provenance"]
    assert (prov["k"], prov["prompts"], prov["seeds"], prov["steps"]) == (4, ["a red cat", "a blue bus"], [0, 1], 2)
    assert prov["model"].startswith(f"local:{name}") and prov["dino_model"].startswith("local:dinov2")
    printed = capsys.readouterr().out
    assert "--vital-layers " + " ".join(map(str, data["vital_layers"])) in printed


@pytest.mark.e2e
@pytest.mark.slow
def test_a_build_takes_the_measured_list_and_records_its_provenance(tmp_path, tiny_models_dir):
    measured = tmp_path / "m"
    measured.mkdir()
    data = _measure(measured, tiny_models_dir, "sd3", "--top", "1")
    table = tmp_path / "pairs.tsv"
    table.write_text("9\tTwo dogs sleep on the couch.\tTwo cats sleep on the couch.\n")
    out = tmp_path / "out"
    argv = [
        *("build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(table)),
        *("--models", "tiny", "--tiny-models-dir", str(tiny_models_dir), "--output", str(out)),
        *("--generator", "sd3", "--image-size", "64", "--steps", "2", "--candidates", "2"),
        *("--vital-layers-from", str(measured / "sd3.json")),
    ]
    assert cli_main(argv) == 0
    manifest = json.loads((out / "build_manifest.json").read_text())
    recorded = manifest["config"]["generator"]["vital_layers"]
    assert recorded["layers"] == data["vital_layers"] and recorded["provenance"]["k"] == 4
    assert "vital_layers_from" not in json.dumps(manifest["config"]["images"]) or (
        manifest["config"]["images"]["vital_layers_from"] is None
    )
    card = (out / "README.md").read_text()
    assert "measured by `counterfactory doctor vital-layers`" in card


def test_sd3s_default_layers_are_labelled_unmeasured_in_help_and_manifest(capsys, tmp_path):
    from builders.app.cli import build_parser
    from builders.counterfactuals.builder import from_args

    with pytest.raises(SystemExit):
        cli_main(["build", "coco-counterfactuals", "--help"])
    assert "UNMEASURED" in " ".join(capsys.readouterr().out.split())
    table = tmp_path / "pairs.tsv"
    table.write_text("9\ta dog\ta cat\n")
    argv = ["build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(table)]
    argv += ["--output", str(tmp_path / "o"), "--generator", "sd3"]
    record = from_args(build_parser().parse_args(argv)).info().config["generator"]["vital_layers"]
    assert record["layers"] == [0, 7, 8, 9] and record["provenance"].startswith("UNMEASURED")
    argv[-1] = "flux"
    record = from_args(build_parser().parse_args(argv)).info().config["generator"]["vital_layers"]
    # Stable Flow's code: double-stream 0, 1, 17, 18 and single-stream 6, 9, 34, 35, 37 (19 + i).
    assert record["layers"] == [0, 1, 17, 18, 25, 28, 53, 54, 56]


def test_a_bypassed_block_returns_its_input_on_both_streams(tiny_models_dir):
    pipe = load_generator("flux", generator_model(GENERATORS["flux"], "tiny", "", tiny_models_dir))
    t = pipe.transformer
    block = t.transformer_blocks[0]
    torch.manual_seed(0)
    hidden, text = torch.randn(1, 16, t.inner_dim), torch.randn(1, 8, t.inner_dim)
    temb = torch.randn(1, t.inner_dim)
    rope = t.pos_embed(torch.zeros(24, 3))
    kwargs = dict(hidden_states=hidden, encoder_hidden_states=text, temb=temb, image_rotary_emb=rope)
    undo = bypassed(block)
    out_text, out_hidden = block(**kwargs)
    assert torch.equal(out_text, text) and torch.equal(out_hidden, hidden)
    undo()
    out_text, out_hidden = block(**kwargs)
    assert not torch.allclose(out_hidden, hidden)


def test_given_layers_pick_the_blocks_in_stable_flows_numbering():
    flux = {"num_layers": 3, "num_single_layers": 4}
    assert vital_layer_map(flux, [0, 4]) == {
        "transformer_blocks.0.attn.processor": "image",
        "single_transformer_blocks.1.attn.processor": "image_after_text",
    }
    with pytest.raises(UserFacingError, match="blocks 0..6"):
        vital_layer_map(flux, [7])


def test_vital_layers_are_refused_for_the_unet_generators(tmp_path, capsys):
    table = tmp_path / "pairs.tsv"
    table.write_text("9\ta dog\ta cat\n")
    argv = ["build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(table)]
    assert cli_main([*argv, "--output", str(tmp_path / "o"), "--vital-layers", "0", "1"]) != 0
    assert "only applies to the MM-DiT generators" in error_line(capsys)
    bad = tmp_path / "bad.json"
    provenance = {"model": "black-forest-labs/FLUX.1-schnell", "revision": None, "dino_model": "d", "k": 1}
    bad.write_text(json.dumps({"generator": "flux", "vital_layers": [0], "blocks": ["b"], "provenance": provenance}))
    assert (
        cli_main([*argv, "--output", str(tmp_path / "o"), "--generator", "sd3", "--vital-layers-from", str(bad)]) != 0
    )
    assert "measured flux model black-forest-labs/FLUX.1-schnell (1 block), but this build loads sd3" in error_line(
        capsys
    )
