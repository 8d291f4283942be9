"""Reference settings from what the model is, not from how its id is spelled (issue #52 items 1
and 2; builders/counterfactuals/METHOD.md §2, "Reference settings"), through the command line.

Each id the issue tried gets its own model's settings: steps, guidance, T5 length and dtype from
one decision. Local folders hold only the JSON configs a real download has (`model_index.json`,
`transformer/config.json`): the decision reads them before any weight loads. The expected values
are the models' cards and diffusers' pipeline defaults, written here (the diffusers defaults are
also read off the installed pipelines' signatures), not read from the table under test."""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path

import pytest
import torch

from builders.app.cli import build_parser
from builders.app.cli import main as cli_main
from builders.counterfactuals.builder import from_args

from helpers.build_helpers import error_line

PAIRS = [("9", "Two dogs sleep on the couch.", "Two cats sleep on the couch.")]


def _builder(tmp_path: Path, *extra: str):
    """The builder the command line makes (no model is loaded)."""
    table = tmp_path / "pairs.tsv"
    table.write_text("".join("\t".join(p) + "\n" for p in PAIRS))
    argv = [
        *("build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(table)),
        *("--models", "production", "--output", str(tmp_path / "out"), *extra),
    ]
    return from_args(build_parser().parse_args(argv))


def _folder(root: Path, name: str, pipeline: str, transformer: dict) -> str:
    """A model folder as a download lays it out, its JSON configs only."""
    folder = root / name
    (folder / "transformer").mkdir(parents=True)
    (folder / "model_index.json").write_text(json.dumps({"_class_name": pipeline}))
    (folder / "transformer" / "config.json").write_text(json.dumps(transformer))
    return str(folder)


# transformer/config.json fields of the real models (their Hub configs).
FLUX_DEV = {"_class_name": "FluxTransformer2DModel", "num_layers": 19, "guidance_embeds": True}
FLUX_SCHNELL = {"_class_name": "FluxTransformer2DModel", "num_layers": 19, "guidance_embeds": False}
SD35_MEDIUM = {
    "_class_name": "SD3Transformer2DModel",
    "num_layers": 24,
    "dual_attention_layers": list(range(13)),
    "qk_norm": "rms_norm",
}


def _settings(builder) -> tuple:
    images = builder.config.images
    return tuple(images.guidance_range), images.steps


# -- item 1: each id the issue tried ------------------------------------------------------------


def test_sd35_large_turbo_gets_its_cards_4_steps_and_no_guidance(tmp_path):
    # SD3.5-large-turbo's card: num_inference_steps=4, guidance_scale=0.0.
    b = _builder(tmp_path, "--generator", "sd3", "--generator-model", "stabilityai/stable-diffusion-3.5-large-turbo")
    assert _settings(b) == ((0.0, 0.0), 4)


@pytest.mark.parametrize("name", ["sd35m", "models--stabilityai--stable-diffusion-3.5-medium/snapshots/0123abcd"])
def test_a_local_sd35_medium_folder_gets_its_cards_40_steps_and_4_5(name, tmp_path):
    """By its transformer's dual-attention (MMDiT-X) layers, which only SD3.5-medium has, or by
    the Hub cache's layout of its id; its card: 40 steps, guidance 4.5."""
    folder = _folder(tmp_path, name, "StableDiffusion3Pipeline", SD35_MEDIUM)
    assert _settings(_builder(tmp_path, "--generator", "sd3", "--generator-model", folder)) == ((4.5, 4.5), 40)


@pytest.mark.parametrize("model", ["/models/FLUX.1-dev", "black-forest-labs/flux.1-dev", "FLUX.1-DEV"])
def test_flux_dev_however_spelled_gets_devs_settings(model, tmp_path):
    # FluxPipeline's defaults for FLUX.1-dev: 28 steps, guidance 3.5, 512 T5 tokens.
    b = _builder(tmp_path, "--generator", "flux", "--generator-model", model)
    assert _settings(b) == ((3.5, 3.5), 28)
    assert b.info().config["generator"]["reference"]["t5_tokens"] == 512


def test_a_local_flux_dev_folder_is_dev_by_its_name_and_its_guidance_embedding(tmp_path):
    folder = _folder(tmp_path, "FLUX.1-dev", "FluxPipeline", FLUX_DEV)
    b = _builder(tmp_path, "--generator", "flux", "--generator-model", folder)
    assert _settings(b) == ((3.5, 3.5), 28)
    reference = b.info().config["generator"]["reference"]
    assert (reference["model"], reference["t5_tokens"], reference["dtype"]) == (
        "black-forest-labs/FLUX.1-dev",
        512,
        "bf16",
    )
    assert str(tmp_path) not in json.dumps(reference)  # the local path is not recorded


@pytest.mark.parametrize("local", [False, True])
def test_flux_krea_dev_is_an_unknown_variant_with_flux_pipeline_defaults(local, tmp_path, caplog):
    """Not in the known table (its card could not be checked); a guidance-embedded FLUX, so
    FluxPipeline's defaults (28 / 3.5 / 512), said in one log line and recorded as unknown."""
    model = _folder(tmp_path, "FLUX.1-Krea-dev", "FluxPipeline", FLUX_DEV) if local else "FLUX.1-Krea-dev"
    with caplog.at_level(logging.INFO):
        b = _builder(tmp_path, "--generator", "flux", "--generator-model", model)
    assert _settings(b) == ((3.5, 3.5), 28)
    reference = b.info().config["generator"]["reference"]
    assert reference["known"] is False and reference["t5_tokens"] == 512
    assert "unknown FLUX variant" in reference["source"]
    said = [r.getMessage() for r in caplog.records if "not a known flux model" in r.getMessage()]
    assert len(said) == 1, said


def test_a_name_the_config_contradicts_does_not_pick_the_entry(tmp_path):
    """A folder named FLUX.1-dev whose transformer has no guidance embedding is not FLUX.1-dev:
    it reads no guidance and 256 T5 tokens, and the dtype, T5 length and guidance agree."""
    folder = _folder(tmp_path, "FLUX.1-dev", "FluxPipeline", FLUX_SCHNELL)
    b = _builder(tmp_path, "--generator", "flux", "--generator-model", folder)
    reference = b.info().config["generator"]["reference"]
    assert reference["known"] is False and reference["t5_tokens"] == 256
    assert tuple(b.config.images.guidance_range) == (0.0, 0.0)


def test_flags_still_override_the_reference(tmp_path):
    argv = ["--generator", "sd3", "--generator-model", "stabilityai/stable-diffusion-3.5-large-turbo"]
    b = _builder(tmp_path, *argv, "--steps", "9", "--guidance-range", "2", "3")
    assert _settings(b) == ((2.0, 3.0), 9)


def test_a_model_of_another_family_is_one_line(tmp_path, capsys):
    table = tmp_path / "pairs.tsv"
    table.write_text("\t".join(PAIRS[0]) + "\n")
    folder = _folder(tmp_path, "some-flux", "FluxPipeline", FLUX_DEV)
    argv = ["build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(table)]
    argv += ["--output", str(tmp_path / "out"), "--generator", "sd3", "--generator-model", folder]
    assert cli_main(argv) != 0
    assert "FluxPipeline (--generator flux)" in error_line(capsys)


def test_the_loaded_pipeline_must_be_the_model_the_settings_were_resolved_for(tmp_path, tiny_models_dir):
    """The tiny FLUX has no guidance embedding: a build whose settings were resolved for
    FLUX.1-dev (its configs not read before loading) refuses it in one line."""
    from builders.counterfactuals.config import ImageStageConfig
    from builders.counterfactuals.generators import GENERATORS, generator_model
    from builders.counterfactuals.images import ImageStage
    from builders.counterfactuals.model_references import resolve
    from builders.engine.errors import UserFacingError
    from builders.models.loaders import load_generator

    pipe = load_generator("flux", generator_model(GENERATORS["flux"], "tiny", "", tiny_models_dir))
    dev = resolve("flux", "black-forest-labs/FLUX.1-dev").record()
    with pytest.raises(UserFacingError, match="not black-forest-labs/FLUX.1-dev"):
        ImageStage(pipe, None, ImageStageConfig(generator="flux", reference=dev), seed=0)
    # Its own decision (an unknown, schnell-like variant) is accepted.
    own = resolve("flux", str(generator_model(GENERATORS["flux"], "tiny", "", tiny_models_dir))).record()
    assert ImageStage(pipe, None, ImageStageConfig(generator="flux", reference=own), seed=0).config.reference == own


@pytest.mark.parametrize(
    "pipeline, generator, expected",
    [
        ("StableDiffusionXLPipeline", "sdxl", (50, 5.0, None)),
        ("StableDiffusion3Pipeline", "sd3", (28, 7.0, 256)),
        ("FluxPipeline", "flux", (28, 3.5, 512)),
    ],
)
def test_unknown_variants_get_the_installed_diffusers_pipeline_defaults(pipeline, generator, expected, tmp_path):
    import diffusers

    params = inspect.signature(getattr(diffusers, pipeline).__call__).parameters
    defaults = tuple(params[k].default if k in params else None for k in ("num_inference_steps", "guidance_scale"))
    t5 = params["max_sequence_length"].default if "max_sequence_length" in params else None
    assert (*defaults, t5) == expected
    b = _builder(tmp_path, "--generator", generator, "--generator-model", "someone/a-fine-tune")
    reference = b.info().config["generator"]["reference"]
    assert (reference["steps"], reference["guidance"][0], reference["t5_tokens"]) == expected
    assert reference["known"] is False


# -- item 2: dtype per model, and the native-bf16 fallback ----------------------------------------


def _native_bf16(monkeypatch, native: bool) -> None:
    """A GPU whose bf16 is native (Ampere on) or emulated only (V100, T4): torch's default query
    counts emulation, `including_emulation=False` does not."""
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: native or including_emulation
    )


@pytest.mark.parametrize(
    "model", ["stabilityai/stable-diffusion-3.5-large", "stabilityai/stable-diffusion-3.5-large-turbo"]
)
def test_sd35_runs_in_bf16_as_its_card(model, tmp_path, monkeypatch):
    _native_bf16(monkeypatch, True)
    b = _builder(tmp_path, "--generator", "sd3", "--generator-model", model, "--device", "cuda:0")
    assert b.precision().dtype == "bf16"
    # SD3-medium's card runs fp16.
    assert _builder(tmp_path, "--generator", "sd3", "--device", "cuda:0").precision().dtype == "fp16"


def test_emulated_bf16_falls_back_to_fp16_logged_and_recorded(tmp_path, monkeypatch, capsys):
    _native_bf16(monkeypatch, False)
    b = _builder(tmp_path, "--generator", "flux", "--device", "cuda:0")
    assert b.precision().dtype == "fp16"
    assert "native bfloat16" in b.info().config["precision"]["fallback"]
    # Asked for explicitly, emulated bf16 is refused in one line.
    table = tmp_path / "pairs.tsv"
    argv = ["build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(table), "--models"]
    argv += ["tiny", "--output", str(tmp_path / "o2"), "--generator", "flux", "--device", "cuda:0", "--dtype", "bf16"]
    assert cli_main(argv) != 0
    assert "no native bfloat16" in error_line(capsys)
    # With native bf16 there is no fallback to record.
    _native_bf16(monkeypatch, True)
    native = _builder(tmp_path, "--generator", "flux", "--device", "cuda:0")
    assert native.precision().dtype == "bf16" and "fallback" not in native.info().config["precision"]


def test_sd3_at_guidance_0_runs_without_guidance_as_the_pipeline(tiny_models_dir):
    """SD3.5-large-turbo's guidance 0: StableDiffusion3Pipeline runs no classifier-free guidance at
    a scale <= 1 (`do_classifier_free_guidance = guidance_scale > 1`), i.e. the conditional
    velocity, written out here with the transformer; the guidance formula at 0 would give the
    unconditional one."""
    from builders.counterfactuals.generators import GENERATORS, generator_model
    from builders.counterfactuals.mmdit_edit import _Renderer
    from builders.models.loaders import load_generator

    pipe = load_generator("sd3", generator_model(GENERATORS["sd3"], "tiny", "", tiny_models_dir))
    r = _Renderer(pipe, "sd3", 64, 256)
    cond = r.encode(["a dog on a sofa", "a cat on a sofa"])
    x = r.initial([torch.Generator().manual_seed(0)], cond.embeds.dtype)
    t = torch.tensor(500.0)
    with torch.no_grad():
        got = r.velocity(cond, x, t, [0], [0.0])

        def plain(embeds, pooled):
            return pipe.transformer(
                hidden_states=x, timestep=t.expand(1), encoder_hidden_states=embeds, pooled_projections=pooled
            ).sample

        conditional = plain(cond.embeds[[0]], cond.pooled[[0]])
        unconditional = plain(cond.neg_embeds[[0]], cond.neg_pooled[[0]])
    torch.testing.assert_close(got, conditional)
    assert not torch.allclose(got, unconditional, atol=1e-4)


def test_a_hub_ids_cached_configs_decide_and_the_record_does_not_depend_on_the_cache(tmp_path, monkeypatch):
    """The Hub cache's JSON (here mocked) decides for an id: FLUX.1-Krea-dev with FLUX.1-dev's
    transformer config is recorded as before its configs were cached (a resumed build keeps its
    fingerprint); an id whose cached config has no guidance embedding reads no guidance."""
    import builders.counterfactuals.model_references as refs

    model = "black-forest-labs/FLUX.1-Krea-dev"
    uncached = _builder(tmp_path, "--generator", "flux", "--generator-model", model).info()
    cached = {"model_index.json": {"_class_name": "FluxPipeline"}, "transformer/config.json": FLUX_DEV}
    monkeypatch.setattr(refs, "_hub_json", lambda repo, filename, revision: cached[filename])
    again = _builder(tmp_path, "--generator", "flux", "--generator-model", model).info()
    assert again.config["generator"]["reference"] == uncached.config["generator"]["reference"]
    assert again.config["images"] == uncached.config["images"]
    cached["transformer/config.json"] = FLUX_SCHNELL
    b = _builder(tmp_path, "--generator", "flux", "--generator-model", "someone/flux-distilled")
    assert _settings(b) == ((0.0, 0.0), 28) and b.info().config["generator"]["reference"]["t5_tokens"] == 256
