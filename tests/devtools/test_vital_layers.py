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
    argv += ["--prompts", "a red cat", "a blue bus", "--samples", "4", "--steps", "2", "--output", str(out)]
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
    # Sample i: prompt i mod 2, seed i.
    assert (prov["k"], prov["prompts"], prov["seeds"], prov["steps"]) == (
        4,
        ["a red cat", "a blue bus"] * 2,
        [0, 1, 2, 3],
        2,
    )
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


@pytest.mark.e2e
def test_a_flux_build_with_the_published_list_says_where_it_was_measured(tmp_path, tiny_models_dir):
    table = tmp_path / "pairs.tsv"
    table.write_text("9\tTwo dogs sleep on the couch.\tTwo cats sleep on the couch.\n")
    out = tmp_path / "out"
    argv = [
        *("build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(table)),
        *("--models", "tiny", "--tiny-models-dir", str(tiny_models_dir), "--output", str(out)),
        *("--generator", "flux", "--image-size", "64", "--steps", "2", "--candidates", "1"),
    ]
    assert cli_main(argv) == 0
    said = "measured on black-forest-labs/FLUX.1-dev, applied here to an unknown flux variant"
    manifest = json.loads((out / "build_manifest.json").read_text())
    assert said in manifest["config"]["generator"]["vital_layers"]["provenance"]
    assert said in " ".join((out / "README.md").read_text().split())


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


def _knee_by_distance(similarity: list[float]) -> list[int]:
    """Independent reading of the knee (Kneedle, Satopää et al. 2011): sort ascending, scale both
    axes to [0, 1], take the point furthest from the chord by the point-to-line distance on the
    side above it; the blocks ranked before it are vital."""
    order = sorted(range(len(similarity)), key=lambda i: (similarity[i], i))
    lo, hi, n = similarity[order[0]], similarity[order[-1]], len(order)
    if hi == lo:
        return []
    best, knee = 0.0, 0
    for rank, i in enumerate(order):
        x, y = rank / (n - 1), (similarity[i] - lo) / (hi - lo)
        # Signed distance of (x, y) from the line through (0, 0) and (1, 1): |ax + by| / |(a, b)|.
        above = (y - x) / 2**0.5
        if above > best + 1e-12:
            best, knee = above, rank
    return sorted(order[:knee])


def _run_with_scores(tmp_path, tiny, monkeypatch, scores, *extra) -> tuple[int, Path]:
    """The CLI on the tiny FLUX with the bypass scores replaced by `scores` (no image is drawn)."""
    import builders.devtools.vital_layers as vital

    monkeypatch.setattr(vital, "rank_blocks", lambda *a: list(scores))
    out = tmp_path / "flux.json"
    argv = ["doctor", "vital-layers", "--generator", "flux", "--models", "tiny", "--tiny-models-dir", str(tiny)]
    return cli_main([*argv, "--samples", "1", "--output", str(out), *extra]), out


def test_the_set_is_read_off_the_rankings_knee_and_printed_with_every_score(
    tmp_path, tiny_models_dir, monkeypatch, capsys
):
    # The tiny FLUX has 6 blocks; blocks 1 and 3 change the image far more than the others.
    scores = [0.97, 0.41, 0.99, 0.55, 0.98, 0.96]
    rc, out = _run_with_scores(tmp_path, tiny_models_dir, monkeypatch, scores)
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["vital_layers"] == _knee_by_distance(scores) == [1, 3]
    assert data["provenance"]["rule"].startswith("the blocks ranked before the knee")
    printed = capsys.readouterr().out
    # Every block's score, the vital ones marked: rows `rank index name score [yes]`.
    rows = [line.split() for line in printed.splitlines() if "transformer_blocks." in line]
    assert {int(r[1]): float(r[3]) for r in rows} == {i: round(s, 6) for i, s in enumerate(scores)}
    assert {int(r[1]) for r in rows if r[-1] == "yes"} == {1, 3}
    assert "--vital-layers 1 3" in printed


@pytest.mark.parametrize("seed", range(5))
def test_the_knee_rule_agrees_with_an_independent_reading_on_flux_sized_tables(seed):
    from builders.devtools.vital_layers import knee_layers

    rng = np.random.default_rng(seed)
    # 57 blocks: a few whose bypass changes the image (similarity 0.3-0.8), the rest near 1.
    scores = rng.uniform(0.93, 1.0, 57)
    vital = rng.choice(57, size=int(rng.integers(3, 12)), replace=False)
    scores[vital] = rng.uniform(0.3, 0.8, len(vital))
    assert knee_layers(scores.tolist()) == _knee_by_distance(scores.tolist())
    assert set(knee_layers(scores.tolist())) >= set(vital.tolist())


def test_a_flat_ranking_has_no_vital_layers(tmp_path, tiny_models_dir, monkeypatch, capsys):
    # On the tiny FLUX every block once scored 1.0000, and the default top of 9 made all 6 "vital".
    rc, out = _run_with_scores(tmp_path, tiny_models_dir, monkeypatch, [1.0] * 6)
    assert rc == 0 and json.loads(out.read_text())["vital_layers"] == []
    printed = capsys.readouterr().out
    assert "no vital layers by the blocks ranked before the knee" in printed
    assert "with no vital layers: a build cannot take it" in printed


def test_top_beyond_the_block_count_is_refused_in_one_line(tmp_path, tiny_models_dir, monkeypatch, capsys):
    rc, out = _run_with_scores(tmp_path, tiny_models_dir, monkeypatch, [0.5] * 6, "--top", "9")
    assert rc != 0 and not out.exists()
    assert "--top 9 is more than this transformer's 6 blocks: give at most 6" in error_line(capsys)


class _Loaded(Exception):
    """Raised by the stand-in loader: the measurement stops at the model it would load."""


def test_by_default_flux_dev_is_measured_on_stable_flows_64_samples(tmp_path, monkeypatch):
    import builders.devtools.vital_layers as vital
    import builders.models.loaders as loaders

    seen = {}

    def load(kind, model, **_kw):
        raise _Loaded(kind, model)

    def measure(cfg, tiny_dir=None):
        seen["pairs"] = cfg.pairs()
        return original(cfg, tiny_dir)

    original = vital.measure
    monkeypatch.setattr(loaders, "load_generator", load)
    monkeypatch.setattr(vital, "measure", measure)
    with pytest.raises(_Loaded) as loaded:
        cli_main(["doctor", "vital-layers", "--generator", "flux", "--output", str(tmp_path / "v.json")])
    # The model Stable Flow measured its published list on, not the build's default schnell.
    assert loaded.value.args == ("flux", "black-forest-labs/FLUX.1-dev")
    assert len(seen["pairs"]) == 64 and len({s for _, s in seen["pairs"]}) == 64


def test_the_tiny_profile_defaults_to_few_steps_and_samples(tmp_path, tiny_models_dir, monkeypatch):
    # SD3 at its reference 28 steps had not finished 1 of 4 tiny blocks in 4 min 40 s.
    import builders.devtools.vital_layers as vital

    def one_draw(draw, embed, transformer, names, pairs):
        assert draw(*pairs[0]).shape == (64, 64, 3)  # the pipeline runs at the tiny defaults
        return [1.0] * len(names)

    monkeypatch.setattr(vital, "rank_blocks", one_draw)
    out = tmp_path / "sd3.json"
    argv = ["doctor", "vital-layers", "--generator", "sd3", "--models", "tiny", "--tiny-models-dir"]
    assert cli_main([*argv, str(tiny_models_dir), "--output", str(out)]) == 0
    prov = json.loads(out.read_text())["provenance"]
    assert (prov["steps"], prov["k"]) == (2, 4)
