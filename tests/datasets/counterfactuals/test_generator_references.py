"""Each generator at its own reference settings (issue #43 items 1, 2, 3, 5;
builders/counterfactuals/METHOD.md §2, "Reference settings"), through the command line:
`counterfactory build coco-counterfactuals --generator G` resolves G's own guidance range and
steps (and those of a known model of its family), `--dtype auto` G's reference dtype, FLUX.1's T5
length by variant, and Prompt-to-Prompt's two injection fractions.

The expected values are the published ones (the paper, the models' cards, diffusers' pipeline
defaults, Black Forest Labs' CLI), written here, not read from the registry under test."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from builders.app.cli import build_parser
from builders.app.cli import main as cli_main
from builders.counterfactuals.builder import from_args
from builders.counterfactuals.config import ImageStageConfig
from builders.counterfactuals.generators import GENERATORS
from builders.counterfactuals.images import EDIT_BEYOND_TEXT_ENCODER, ImageStage, candidate_specs
from builders.counterfactuals.prompt_to_prompt import P2PController, PairSpec, generate_pairs, row_keys

from helpers.build_helpers import error_line

PAIRS = [("9", "Two dogs sleep on the couch.", "Two cats sleep on the couch.")]


def _argv(tmp_path: Path, *extra: str, models: str = "production") -> list[str]:
    table = tmp_path / "pairs.tsv"
    table.write_text("".join("\t".join(p) + "\n" for p in PAIRS))
    return [
        *("build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(table)),
        *("--models", models, "--output", str(tmp_path / "out"), *extra),
    ]


def _builder(tmp_path: Path, *extra: str):
    """The builder the command line makes (no model is loaded)."""
    return from_args(build_parser().parse_args(_argv(tmp_path, *extra)))


# -- item 3: guidance range and steps per generator and per known model --------------------------


@pytest.mark.parametrize(
    "argv, guidance, steps",
    [
        # The paper's SD v1.5: guidance ~ U(7.5, 15), 100 steps (Le et al. 2023 App. B.1.2).
        (["--generator", "sd15"], (7.5, 15.0), 100),
        # StableDiffusionXLPipeline's defaults: guidance 5.0, 50 steps.
        (["--generator", "sdxl"], (5.0, 5.0), 50),
        # SD3-medium's card and StableDiffusion3Pipeline: CFG 7.0 at 28 steps.
        (["--generator", "sd3"], (7.0, 7.0), 28),
        # SD3.5-large's card: 3.5 at 28 steps; SD3.5-medium's: 4.5 at 40.
        (["--generator", "sd3", "--generator-model", "stabilityai/stable-diffusion-3.5-large"], (3.5, 3.5), 28),
        (["--generator", "sd3", "--generator-model", "stabilityai/stable-diffusion-3.5-medium"], (4.5, 4.5), 40),
        # FLUX.1-schnell: 4 steps, no guidance.
        (["--generator", "flux"], (0.0, 0.0), 4),
        # FLUX.1-dev: guidance embedding 3.5 (Stable Flow, FluxPipeline), FluxPipeline's 28 steps.
        (["--generator", "flux", "--generator-model", "black-forest-labs/FLUX.1-dev"], (3.5, 3.5), 28),
        (["--generator", "flux", "--generator-model", "black-forest-labs/FLUX.1-dev@main"], (3.5, 3.5), 28),
        # An explicit value wins.
        (["--generator", "flux", "--guidance-range", "1", "2", "--steps", "9"], (1.0, 2.0), 9),
    ],
)
def test_each_generator_and_known_model_gets_its_reference_guidance_and_steps(argv, guidance, steps, tmp_path):
    images = _builder(tmp_path, *argv).config.images
    assert (tuple(images.guidance_range), images.steps) == (guidance, steps)


def test_the_tiny_profile_keeps_its_steps_and_takes_the_generators_guidance(tmp_path, tiny_models_dir):
    args = _argv(tmp_path, "--generator", "sd3", "--tiny-models-dir", str(tiny_models_dir), models="tiny")
    images = from_args(build_parser().parse_args(args)).config.images
    assert (tuple(images.guidance_range), images.steps) == ((7.0, 7.0), 2)


# -- item 2: --dtype auto per generator ----------------------------------------------------------


@pytest.mark.parametrize("name, bf16, expected", [
    ("sd15", True, "fp16"),
    ("sdxl", True, "fp16"),
    ("sd3", True, "fp16"),
    ("flux", True, "bf16"),
    ("flux", False, "fp16"),
    ("sd3", False, "fp16"),
])  # fmt: skip
def test_dtype_auto_is_each_generators_reference_dtype_on_cuda(name, bf16, expected, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    builder = _builder(tmp_path, "--generator", name, "--device", "cuda:0")
    with caplog.at_level(logging.INFO, logger="builders.engine.precision"):
        assert builder.precision().dtype == expected
    # Without native bf16, FLUX runs in fp16 as diffusers and Stable Flow run it (#52), saying
    # why in one line.
    said = [r.getMessage() for r in caplog.records if "bfloat16" in r.getMessage()]
    assert len(said) == (name == "flux" and not bf16)


@pytest.mark.parametrize("name", ["sd15", "flux"])
def test_dtype_auto_stays_fp32_on_the_cpu(name, tmp_path):
    assert _builder(tmp_path, "--generator", name, "--device", "cpu").precision().dtype == "fp32"


# -- item 1: FLUX.1's T5 length by variant ----------------------------------------------------------


class _Config(dict):
    __getattr__ = dict.__getitem__


def test_flux_reads_256_t5_tokens_as_schnell_and_512_as_dev(tiny_models_dir):
    """A swap at T5 token ~300 is past schnell's 256 (Black Forest Labs' CLI: max_length=256 for
    schnell) and inside dev's 512. (The tiny T5 tokenizer reads one token per character.)"""
    from builders.models.loaders import load_generator
    from builders.counterfactuals.generators import generator_model

    pipe = load_generator("flux", generator_model(GENERATORS["flux"], "tiny", "", tiny_models_dir))
    prefix = "x" * 300
    for dev, expected in ((False, EDIT_BEYOND_TEXT_ENCODER), (True, None)):
        pipe.transformer.register_to_config(guidance_embeds=dev)
        stage = ImageStage(pipe, None, ImageStageConfig(generator="flux"), seed=0)
        assert stage.unseen_edit(f"{prefix} dog", f"{prefix} cat") == expected, dev
        # Inside 256 both read the swap.
        assert stage.unseen_edit("x" * 200 + " dog", "x" * 200 + " cat") is None


@pytest.mark.slow
@pytest.mark.e2e
def test_a_flux_schnell_build_skips_a_swap_past_256_t5_tokens_and_records_its_reference(tmp_path, tiny_models_dir):
    """The tiny FLUX (no guidance embedding: schnell-like) through the command line: a swap at T5
    token ~300 is skipped (drawn with 512 before #43), the rows' guidance is 0 (none read), and the
    manifest and card record the reference settings."""
    long = "x" * 300
    table = tmp_path / "pairs.tsv"
    table.write_text("".join("\t".join(p) + "\n" for p in [*PAIRS, ("long", f"{long} dog.", f"{long} cat.")]))
    out = tmp_path / "out"
    argv = [
        *("build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(table)),
        *("--models", "tiny", "--tiny-models-dir", str(tiny_models_dir), "--output", str(out)),
        *("--generator", "flux", "--image-size", "64", "--steps", "2", "--candidates", "2"),
        *("--max-error-fraction", "1"),
    ]
    assert cli_main(argv) == 0
    manifest = json.loads((out / "build_manifest.json").read_text())
    assert manifest["skipped"] == {EDIT_BEYOND_TEXT_ENCODER: 1}
    assert manifest["config"]["images"]["guidance_range"] == [0.0, 0.0]
    # The tiny FLUX is no known model: FluxPipeline's defaults for a transformer without a
    # guidance embedding (#52), recorded as such.
    reference = manifest["config"]["generator"]["reference"]
    assert (reference["known"], reference["t5_tokens"], reference["guidance"]) == (False, 256, [0.0, 0.0])
    card = (out / "README.md").read_text()
    assert "guidance 0.0" in card and "unknown FLUX variant" in card


# -- item 5: Prompt-to-Prompt's two fractions --------------------------------------------------------


def test_the_two_fractions_reach_every_candidate_through_the_command_line(tmp_path):
    argv = ["--inject", "cross", "--cross-replace-fraction", "0.8", "--self-replace-fraction", "0.4"]
    images = _builder(tmp_path, *argv).config.images
    specs = candidate_specs(0, "9", images)
    assert {(s.p, s.p_self) for s in specs} == {(0.8, 0.4)}
    # The default stays the paper's single p per candidate, for both maps.
    default = candidate_specs(0, "9", _builder(tmp_path, "--inject", "cross").config.images)
    assert all(s.p_self is None and 0.1 <= s.p <= 0.9 for s in default)
    assert len({s.p for s in default}) == len(default)


def test_cross_maps_follow_one_fraction_and_self_maps_the_other():
    """10 steps, cross 0.8 and self 0.4: cross maps at steps 0-7 (0.8 > i/9 for i <= 7), self
    maps at steps 0-3 (0.4 > i/9 for i <= 3), as P2P's notebook counts its replace steps."""
    ctrl = P2PController([PairSpec(1, 0.8, 7.5, p_self=0.4)], 10, "cross", torch.eye(4))
    cross, self_ = [], []
    for i in range(10):
        ctrl.step = i
        cross.append(ctrl.rows((1,)) is not None)
        self_.append(ctrl.rows((1,), self_maps=True) is not None)
    assert cross == [True] * 8 + [False] * 2
    assert self_ == [True] * 4 + [False] * 6
    # Shared computation tells apart candidates whose self fraction alone differs.
    specs = [PairSpec(1, 0.8, 7.5, p_self=0.4), PairSpec(1, 0.8, 7.5, p_self=0.7)]
    keys = row_keys(specs, 10, 5, share=True)
    assert keys[0] == keys[2] and keys[1] != keys[3]


@pytest.mark.slow
@pytest.mark.parametrize("inject", ["cross", "both"])
def test_two_fractions_give_the_same_images_with_and_without_shared_computation(inject, tiny_models_dir):
    from builders.models.loaders import load_sd
    from builders.models.profiles import resolve_profile

    pipe = load_sd(resolve_profile("tiny", tiny_models_dir).sd)
    caps = ("a red cat on a wooden table", "a red dog on a wooden table")
    specs = [PairSpec(3, 0.8, 7.5, p_self=0.4), PairSpec(3, 0.8, 7.5, p_self=0.0), PairSpec(3, 0.8, 7.5)]
    kw = dict(steps=4, size=64, inject=inject)
    shared = generate_pairs(pipe, *caps, specs, share=True, **kw)
    alone = generate_pairs(pipe, *caps, specs, share=False, **kw)
    for a, b in zip(shared, alone, strict=True):
        assert (a == b).all()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--inject", "cross", "--cross-replace-fraction", "0.8"], "together"),
        (["--cross-replace-fraction", "0.8", "--self-replace-fraction", "0.4"], "--inject cross"),
        (["--generator", "flux", "--cross-replace-fraction", "0.8", "--self-replace-fraction", "0.4"], "sd15, sdxl"),
    ],
)
def test_misused_fractions_are_one_line(argv, words, tmp_path, capsys):
    assert cli_main(_argv(tmp_path, *argv)) != 0
    assert words in error_line(capsys)


def test_inject_self_is_labelled_the_instruct_pix2pix_variant(tmp_path):
    for name in ("sd15", "sdxl"):
        assert _builder(tmp_path, "--generator", name).info().config["generator"]["method"] == (
            "prompt-to-prompt-instruct-pix2pix/self"
        )
        info = _builder(tmp_path, "--generator", name, "--inject", "cross").info()
        assert info.config["generator"]["method"] == "prompt-to-prompt/cross"
