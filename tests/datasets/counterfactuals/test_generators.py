"""`--generator` for the image stage (issue #37 §1; builders/counterfactuals/METHOD.md §2,
"Generators"): the registry, SDXL Prompt-to-Prompt (a candidate's images depend on its own spec
only; the `--inject` layers on the production-shaped SDXL UNet), the tiny SDXL pipeline of
`--models tiny`, the generator columns of every row, the card's license, sd15 still drawing
today's Prompt-to-Prompt images, and the options the MM-DiT generators refuse.

The sd3 and flux builds run where `builders.counterfactuals.mmdit_edit` and
`builders.models.tiny_mmdit` exist (the MM-DiT method's own branch of #37)."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from builders.app.cli import main as cli_main
from builders.counterfactuals.config import ImageStageConfig
from builders.counterfactuals.generators import GENERATORS, generator_model
from builders.counterfactuals.images import EDIT_BEYOND_TEXT_ENCODER, EDIT_INVISIBLE_TO_TEXT_ENCODER, ImageStage
from builders.counterfactuals.prompt_to_prompt import (
    INJECT_MODES,
    P2PController,
    PairSpec,
    generate_pairs,
    p2p_processors,
)
from builders.counterfactuals.word_swap import replacement_mapper
from builders.counterfactuals.prompt_to_prompt_xl import generate_pairs_xl
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture
from builders.models.loaders import load_generator, load_sd
from builders.models.profiles import resolve_profile

from helpers.build_helpers import error_line, table_images_argv

IMAGE_ARGS = ["--image-size", "64", "--steps", "2", "--candidates", "3", "--candidate-batch", "2"]
CAPTIONS = ("a red cat sitting on a wooden table", "a red dog sitting on a wooden table")
PAIRS = [
    ("A17", "A man riding a horse on a beach.", "A man riding a cow on a beach."),
    ("9", "Two dogs sleep on the couch.", "Two cats sleep on the couch."),
]
MMDIT = importlib.util.find_spec("builders.counterfactuals.mmdit_edit") is not None


def rows(out: Path, config: str = "default") -> list[dict]:
    manifest = json.loads((out / "build_manifest.json").read_text())
    return [
        row
        for key, o in manifest["outputs"].items()
        if key.startswith(f"{config}/")
        for shard in o["shards"]
        for row in pq.read_table(out / shard).to_pylist()
    ]


def pixels(image: dict) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(image["bytes"])).convert("RGB"))


def table_build(tmp_path: Path, tiny: Path, *extra: str, pairs=PAIRS) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    table = tmp_path / "pairs.tsv"
    table.write_text("".join("\t".join(p) + "\n" for p in pairs))
    out = tmp_path / "out"
    argv = table_images_argv(table, tiny, out, *IMAGE_ARGS, *extra)
    with mock.patch.object(sys, "argv", ["counterfactory", *argv]):
        assert cli_main(argv) == 0
    return out


@pytest.fixture(scope="module")
def sdxl_pipe(tiny_models_dir):
    path = generator_model(GENERATORS["sdxl"], "tiny", "", tiny_models_dir)
    return load_generator("sdxl", path)


# -- the fixture builds ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sdxl", "sd3", "flux"])
@pytest.mark.slow
def test_fixture_build_draws_one_word_pairs_and_records_the_generator(name, tmp_path, tiny_models_dir, nltk_data_dir):
    if name != "sdxl" and not MMDIT:
        pytest.skip("the MM-DiT method (builders.counterfactuals.mmdit_edit) is not on this branch")
    coco = write_coco_fixture(tmp_path / "coco", CocoFixtureConfig(n_images=12, release="2017"))
    out = tmp_path / "out"
    argv = [
        "build",
        "coco-counterfactuals",
        "--coco-root",
        str(coco),
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--output",
        str(out),
        "--part-size",
        "4",
        "--max-captions",
        "6",
        "--generator",
        name,
        *IMAGE_ARGS,
    ]
    assert cli_main(argv) == 0
    pairs = rows(out)
    assert len(pairs) >= 2
    spec = GENERATORS[name]
    for row in pairs:
        words_0, words_1 = row["caption_0"].split(), row["caption_1"].split()
        assert len(words_0) == len(words_1), row["id"]
        assert sum(a != b for a, b in zip(words_0, words_1, strict=True)) == 1, row["id"]
        assert row["generator"] == name
        assert row["generation_method"] == spec.method_name("self")
        assert (row["steps"], row["resolution"]) == (2, 64)
        # Each generator's reference guidance (#43): SDXL 5.0, SD3-medium 7.0, FLUX.1-schnell 0.
        assert row["guidance_scale"] == {"sdxl": 5.0, "sd3": 7.0, "flux": 0.0}[name]
        # The tiny pipeline of the generator's family, named by its content digest.
        assert row["sd_model"].startswith(f"local:{name}@sha256:"), row["sd_model"]
        assert pixels(row["image_0"]).shape == pixels(row["image_1"]).shape == (64, 64, 3)
    manifest = json.loads((out / "build_manifest.json").read_text())
    assert manifest["config"]["images"]["generator"] == name
    assert manifest["config"]["generator"]["license"] == spec.license
    card = (out / "README.md").read_text()
    assert f"`--generator {name}`" in card and spec.license in card


@pytest.mark.slow
def test_sd15_draws_todays_prompt_to_prompt_images(tmp_path, tiny_models_dir):
    """`--generator sd15` (the default) renders through the registry what
    `prompt_to_prompt.generate_pairs` draws for the chosen candidate, byte for byte, and records
    itself; a build without the flag is the same build."""
    out = table_build(tmp_path, tiny_models_dir, "--generator", "sd15")
    pipe = load_sd(resolve_profile("tiny", tiny_models_dir).sd)
    published = rows(out)
    assert len(published) == len(PAIRS)
    for row in published:
        assert (row["generator"], row["generation_method"]) == ("sd15", "prompt-to-prompt-instruct-pix2pix/self")
        im0, im1 = generate_pairs(
            pipe,
            row["caption_0"],
            row["caption_1"],
            [PairSpec(row["seed"], row["p"], row["guidance_scale"])],
            steps=2,
            size=64,
        )
        assert np.array_equal(pixels(row["image_0"]), im0[0])
        assert np.array_equal(pixels(row["image_1"]), im1[0])
    manifest = json.loads((out / "build_manifest.json").read_text())
    assert manifest["config"]["generator"]["license"] == "CreativeML Open RAIL-M"
    default = table_build(tmp_path / "default", tiny_models_dir)
    assert [p.read_bytes() for p in sorted((default / "data").rglob("*.parquet"))] == [
        p.read_bytes() for p in sorted((out / "data").rglob("*.parquet"))
    ]


# -- SDXL Prompt-to-Prompt ---------------------------------------------------------------------


@pytest.mark.parametrize("inject", INJECT_MODES)
@pytest.mark.slow
def test_sdxl_candidate_images_depend_on_their_own_spec_only(sdxl_pipe, inject):
    """Batched with others (sharing (seed, guidance) with a group mate, or not) or alone, a
    candidate gets the same images; its original image does not depend on p."""
    specs = [PairSpec(11, 0.2, 7.5), PairSpec(11, 0.8, 7.5), PairSpec(12, 0.5, 9.0)]
    batched = generate_pairs_xl(sdxl_pipe, *CAPTIONS, specs, steps=3, size=64, inject=inject)
    for j, spec in enumerate(specs):
        alone = generate_pairs_xl(sdxl_pipe, *CAPTIONS, [spec], steps=3, size=64, inject=inject)
        assert np.array_equal(batched[0][j], alone[0][0]) and np.array_equal(batched[1][j], alone[1][0]), j
    assert np.array_equal(batched[0][0], batched[0][1])  # the original branch reads no p
    assert not np.array_equal(batched[1][0], batched[1][1])  # the counterfactual does
    unshared = generate_pairs_xl(sdxl_pipe, *CAPTIONS, specs, steps=3, size=64, inject=inject, share=False)
    assert all(np.array_equal(a, b) for a, b in zip(batched, unshared, strict=True))


@pytest.mark.slow
def test_an_sdxl_edit_its_text_encoders_cannot_see_draws_nothing(tmp_path, tiny_models_dir):
    words = " ".join(["a small brown"] * 40)  # far more than 77 tokens
    pairs = [("past", f"{words} dog.", f"{words} cat."), ("case", "A Dog on a mat.", "A dog on a mat."), *PAIRS]
    out = table_build(tmp_path, tiny_models_dir, "--generator", "sdxl", "--max-error-fraction", "1", pairs=pairs)
    manifest = json.loads((out / "build_manifest.json").read_text())
    assert manifest["skipped"] == {EDIT_BEYOND_TEXT_ENCODER: 1, EDIT_INVISIBLE_TO_TEXT_ENCODER: 1}
    assert sorted(r["id"] for r in rows(out)) == sorted(p[0] for p in PAIRS)


def test_each_text_encoder_token_limit_decides_what_an_edit_shows(tiny_models_dir):
    """sd3 and flux read T5 (to 256 tokens, FLUX.1-schnell's too) beside CLIP's 77: a swap past CLIP's limit
    but inside T5's is drawn by them and skipped by the CLIP-only generators. (The tiny CLIP tokenizer, one
    token per character, stands in for T5: the limits are what is tested.)"""
    tok = load_sd(resolve_profile("tiny", tiny_models_dir).sd).tokenizer
    schnell = SimpleNamespace(config=SimpleNamespace(guidance_embeds=False))
    pipe = SimpleNamespace(tokenizer=tok, tokenizer_2=tok, tokenizer_3=tok, transformer=schnell)
    prefix = "x" * 150  # characters, so tokens: past 77, inside 256
    for name, expected in (
        ("sd15", EDIT_BEYOND_TEXT_ENCODER),
        ("sdxl", EDIT_BEYOND_TEXT_ENCODER),
        ("sd3", None),
        ("flux", None),
    ):
        stage = ImageStage(pipe, None, ImageStageConfig(generator=name), seed=0)
        assert stage.unseen_edit(f"{prefix} dog", f"{prefix} cat") == expected, name
        assert stage.unseen_edit("A Dog", "A dog") == EDIT_INVISIBLE_TO_TEXT_ENCODER, name


# SDXL base 1.0's UNet, from its published unet/config.json
# (https://huggingface.co/stabilityai/stable-diffusion-xl-base-1.0/blob/main/unet/config.json).
SDXL_UNET = dict(
    sample_size=128,
    in_channels=4,
    out_channels=4,
    layers_per_block=2,
    block_out_channels=(320, 640, 1280),
    attention_head_dim=(5, 10, 20),
    transformer_layers_per_block=(1, 2, 10),
    cross_attention_dim=2048,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    use_linear_projection=True,
    addition_embed_type="text_time",
    addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816,
    norm_num_groups=32,
)


def test_sdxl_inject_modes_select_the_method_md_layers_at_1024px(meta_nonzero):
    """builders/counterfactuals/METHOD.md §2 on the production-shaped SDXL UNet at 1024 px (128 x 128 latents): `self`
    injects every self-attention layer in both halves; `cross` every cross-attention layer and
    the self-attention layers of at most 32 x 32 query positions (down_blocks.2, the mid block
    and up_blocks.0: the 10-deep transformer blocks), conditional half; `both` the union."""
    from diffusers import UNet2DConditionModel

    meta = torch.device("meta")
    with meta:
        unet = UNet2DConditionModel(**SDXL_UNET)
    # The published count, 2,567,463,684: the config is SDXL base's.
    assert sum(p.numel() for p in unet.parameters()) == 2_567_463_684
    names = [name for name, _ in unet.named_modules()]
    self_layers = {n for n in names if n.endswith("attn1")}
    cross_layers = {n for n in names if n.endswith("attn2")}
    low_res = {n for n in self_layers if n.startswith(("down_blocks.2.", "mid_block.", "up_blocks.0."))}
    assert len(self_layers) == len(cross_layers) == 70 and len(low_res) == 20 + 10 + 30
    expected = {
        "self": {n: (0, 1) for n in self_layers},
        "cross": {**{n: (1,) for n in cross_layers}, **{n: (1,) for n in low_res}},
        "both": {**{n: (0, 1) for n in self_layers}, **{n: (1,) for n in cross_layers}},
    }
    side = 128
    mapper = replacement_mapper([49406, 320, 2368, 49407], [49406, 320, 1929, 49407], 77)
    for mode in INJECT_MODES:
        ctrl = P2PController([PairSpec(0, 0.5, 7.5)], 10, mode, mapper, low_res_tokens=(side // 4) ** 2)
        current, injecting, rows_of = [None], {}, ctrl.rows

        def recording(halves, self_maps=False, rows_of=rows_of, injecting=injecting, current=current):
            # A layer may ask for each half apart (`both`'s low-resolution self maps): the union.
            injecting[current[0]] = tuple(sorted({*injecting.get(current[0], ()), *halves}))
            return rows_of(halves, self_maps)

        ctrl.rows = recording
        hooks = [
            m.register_forward_pre_hook(lambda _m, _a, n=n, current=current: current.__setitem__(0, n))
            for n, m in unet.named_modules()
            if n.endswith(("attn1", "attn2"))
        ]
        try:
            with p2p_processors(unet, ctrl):
                # [uncond o, uncond c, cond o, cond c], with SDXL's pooled text and time ids.
                out = unet(
                    torch.empty(4, 4, side, side, device=meta),
                    10,
                    encoder_hidden_states=torch.empty(4, 77, 2048, device=meta),
                    added_cond_kwargs={
                        "text_embeds": torch.empty(4, 1280, device=meta),
                        "time_ids": torch.empty(4, 6, device=meta),
                    },
                ).sample
        finally:
            for hook in hooks:
                hook.remove()
        assert out.shape == (4, 4, side, side)
        assert injecting == expected[mode], mode


# -- the registry and the options --------------------------------------------------------------


def test_registry_names_each_generators_model_license_and_renderer():
    assert list(GENERATORS) == ["sd15", "sdxl", "sd3", "flux"]
    assert {n: (g.default_model, g.license) for n, g in GENERATORS.items()} == {
        "sd15": ("stable-diffusion-v1-5/stable-diffusion-v1-5", "CreativeML Open RAIL-M"),
        "sdxl": ("stabilityai/stable-diffusion-xl-base-1.0", "CreativeML Open RAIL++-M"),
        "sd3": ("stabilityai/stable-diffusion-3-medium-diffusers", "Stability AI Community License"),
        "flux": ("black-forest-labs/FLUX.1-schnell", "Apache-2.0"),
    }
    # The MM-DiT entries name the contract's functions (#37), resolved only when they run.
    for name in ("sd3", "flux"):
        assert GENERATORS[name].render == "builders.counterfactuals.mmdit_edit:generate_pairs_mmdit"
        assert GENERATORS[name].tiny == f"builders.models.tiny_mmdit:build_tiny_{name}"
    assert GENERATORS["sdxl"].renderer() is generate_pairs_xl
    assert GENERATORS["sd15"].renderer() is generate_pairs


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--generator", "flux", "--inject", "cross"], "--inject"),
        (["--generator", "sd3", "--scheduler", "dpm_solver_pp"], "--scheduler"),
        (["--generator", "sdxl", "--sd-model", "x/y"], "--sd-model"),
        (["--cpu-offload"], "--cpu-offload"),
    ],
)
def test_options_a_generator_cannot_use_are_one_line(argv, flag, tmp_path, tiny_models_dir, capsys):
    table = tmp_path / "pairs.tsv"
    table.write_text("".join("\t".join(p) + "\n" for p in PAIRS))
    out = tmp_path / "out"
    assert (
        cli_main(
            [
                "build",
                "coco-counterfactuals",
                "--stage",
                "images",
                "--captions-from",
                str(table),
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--output",
                str(out),
                *IMAGE_ARGS,
                *argv,
            ]
        )
        == 2
    )
    assert flag in error_line(capsys)
    assert not (out / "build_manifest.json").exists()
