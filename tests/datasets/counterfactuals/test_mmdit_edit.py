"""Stable Flow's vital-layer injection on the MM-DiTs (builders/counterfactuals/METHOD.md §6): the
layers it touches at the production shapes of SD3-medium and FLUX.1, the original image is
diffusers' own pipeline output, a twin that is never injected is the pipeline's image of the edited
caption, injection pulls the twin toward the original, and a candidate's images depend on its
own spec only (whatever its batch, with or without shared computation)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from builders.counterfactuals.generators import flux_t5_tokens
from builders.counterfactuals.mmdit_edit import (
    IMAGE,
    IMAGE_AFTER_TEXT,
    KVController,
    VitalKVProcessor,
    generate_pairs_mmdit,
    vital_layer_map,
    vital_processors,
)
from builders.counterfactuals.prompt_to_prompt import EarlyRejection, PairSpec, UNetWork, injected
from builders.engine.errors import UserFacingError

CAPTIONS = ("a red cat sitting on a wooden table", "a red dog sitting on a wooden table")
META = torch.device("meta")

#: The published transformer configs (the Hub's `transformer/config.json`):
#: stabilityai/stable-diffusion-3-medium-diffusers: 24 JointTransformerBlocks, 24 heads x 64 = 1536,
#: patch 2, 16 latent channels, T5-XXL context 4096, pooled CLIP-L + CLIP-G 768 + 1280 = 2048.
SD3_MEDIUM = dict(
    sample_size=128,
    patch_size=2,
    in_channels=16,
    out_channels=16,
    num_layers=24,
    attention_head_dim=64,
    num_attention_heads=24,
    joint_attention_dim=4096,
    caption_projection_dim=1536,
    pooled_projection_dim=2048,
    pos_embed_max_size=192,
)
#: black-forest-labs/FLUX.1-schnell (FLUX.1-dev: guidance_embeds true): 19 double- and 38
#: single-stream blocks, 24 heads x 128 = 3072, packed 2x2 patches of 16 channels = 64, T5-XXL
#: context 4096, pooled CLIP-L 768, RoPE axes 16 + 56 + 56 = 128.
FLUX_1 = dict(
    patch_size=1,
    in_channels=64,
    num_layers=19,
    num_single_layers=38,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=4096,
    pooled_projection_dim=768,
    guidance_embeds=False,
    axes_dims_rope=(16, 56, 56),
)


def _meta(cls, config):
    with torch.device(META):
        return cls(**config)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from builders.models.tiny_mmdit import build_tiny_flux, build_tiny_sd3

    root = tmp_path_factory.mktemp("tiny_mmdit")
    return {
        "sd3": build_tiny_sd3(root / "sd3"),
        "flux": build_tiny_flux(root / "flux"),
        "flux_dev": build_tiny_flux(root / "flux_dev", guidance_embeds=True),
    }


def _load(tiny_dir, name):
    from diffusers import FluxPipeline, StableDiffusion3Pipeline

    pipe = (StableDiffusion3Pipeline if name == "sd3" else FluxPipeline).from_pretrained(tiny_dir[name])
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def pipes(tiny_dir):
    return {name: _load(tiny_dir, name) for name in tiny_dir}


@pytest.fixture(scope="module")
def sharp(tiny_dir):
    """The tiny pipelines with their attention sharpened (query/key projections x10), as
    test_prompt_to_prompt.py's `sharp_pipe`: random-init attention is nearly uniform, so its
    keys and values carry little of the image's layout for the injection to pass on."""
    out = {}
    for name in ("sd3", "flux"):
        pipe = _load(tiny_dir, name)
        with torch.no_grad():
            for module_name, module in pipe.transformer.named_modules():
                if module_name.endswith("attn"):
                    module.to_q.weight.mul_(10)
                    module.to_k.weight.mul_(10)
        out[name] = pipe
    return out


def _distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """uint8 images equal up to one level of float noise (batched vs unbatched kernels)."""
    return int(np.abs(a.astype(int) - b.astype(int)).max()) <= 1


# ---- the layer map at production shapes ---------------------------------------------------------


def test_vital_layers_at_production_shapes():
    """Stable Flow's vital layers: FLUX.1 double blocks 0, 1, 17, 18 and single blocks 6, 9, 34,
    35, 37 (its blocks 25, 28, 53, 54, 56 of 57); SD3-medium joint blocks 0, 7, 8, 9."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel

    flux = _meta(FluxTransformer2DModel, FLUX_1)
    assert len(flux.transformer_blocks) == 19 and len(flux.single_transformer_blocks) == 38
    assert flux.config.num_attention_heads * flux.config.attention_head_dim == 3072
    assert vital_layer_map(flux.config) == {
        **{f"transformer_blocks.{i}.attn.processor": IMAGE for i in (0, 1, 17, 18)},
        **{f"single_transformer_blocks.{i - 19}.attn.processor": IMAGE_AFTER_TEXT for i in (25, 28, 53, 54, 56)},
    }
    sd3 = _meta(SD3Transformer2DModel, SD3_MEDIUM)
    assert len(sd3.transformer_blocks) == 24 and sd3.inner_dim == 1536
    assert vital_layer_map(sd3.config) == {f"transformer_blocks.{i}.attn.processor": IMAGE for i in (0, 7, 8, 9)}


@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_processors_wrap_the_vital_layers_only(name):
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel

    model = _meta(SD3Transformer2DModel, SD3_MEDIUM) if name == "sd3" else _meta(FluxTransformer2DModel, FLUX_1)
    previous = dict(model.attn_processors)
    assert len(previous) == (24 if name == "sd3" else 19 + 38)
    with vital_processors(model, KVController(1, 512)) as layers:
        installed = model.attn_processors
        assert set(installed) == set(previous)
        wrapped = {n for n, p in installed.items() if isinstance(p, VitalKVProcessor)}
        assert wrapped == set(layers) and len(wrapped) == (4 if name == "sd3" else 9)
        for n, proc in installed.items():
            if n in wrapped:  # diffusers' own processor inside, reading the documented tokens
                assert proc.inner is previous[n] and proc.tokens == layers[n]
            else:  # untouched layers run diffusers' own processor, the same object
                assert proc is previous[n]
    assert model.attn_processors == previous


def test_injection_fires_in_the_vital_layers_at_1024px(monkeypatch, meta_nonzero):
    """A meta-device forward of FLUX.1 at 1024 px (4096 image tokens after 512 T5 tokens): the
    key/value replacement runs in the 9 vital layers, on the image tokens only."""
    from diffusers import FluxTransformer2DModel

    model = _meta(FluxTransformer2DModel, FLUX_1)
    ctrl = KVController(1, 512)
    ctrl.half, ctrl.links = 2, [(0, 1)]
    fired: dict[str, list[int]] = {}
    current = [None]
    hooks = [
        m.register_forward_pre_hook(lambda _m, _a, n=n: current.__setitem__(0, n))
        for n, m in model.named_modules()
        if n.endswith(".attn")
    ]
    original_call = VitalKVProcessor.__call__

    def recording(self, attn, hidden_states, *args, **kwargs):
        start = self.ctrl.text_tokens if self.tokens == IMAGE_AFTER_TEXT else 0
        fired[current[0]] = [start, hidden_states.shape[1]]
        return original_call(self, attn, hidden_states, *args, **kwargs)

    monkeypatch.setattr(VitalKVProcessor, "__call__", recording)
    try:
        with vital_processors(model, ctrl):
            out = model(
                hidden_states=torch.empty(2, 4096, 64, device=META),
                timestep=torch.empty(2, device=META),
                encoder_hidden_states=torch.empty(2, 512, 4096, device=META),
                pooled_projections=torch.empty(2, 768, device=META),
                txt_ids=torch.zeros(512, 3, device=META),
                img_ids=torch.zeros(4096, 3, device=META),
                return_dict=False,
            )[0]
    finally:
        for hook in hooks:
            hook.remove()
    assert out.shape == (2, 4096, 64)
    assert fired == {
        **{f"transformer_blocks.{i}.attn": [0, 4096] for i in (0, 1, 17, 18)},
        **{f"single_transformer_blocks.{i}.attn": [512, 512 + 4096] for i in (6, 9, 34, 35, 37)},
    }


def test_single_stream_injection_leaves_the_text_keys_alone(pipes):
    """In a FLUX single-stream block `to_k`/`to_v` read text then image tokens: only the image
    part of the edited row is replaced. Rows that differ only in their text stay different."""
    attn = pipes["flux"].transformer.single_transformer_blocks[0].attn
    text, image = 5, 7
    torch.manual_seed(0)
    hidden = torch.randn(2, text + image, attn.query_dim)
    hidden[1, text:] = hidden[0, text:] + torch.randn(image, attn.query_dim)  # images differ
    ctrl = KVController(1, text)
    ctrl.half, ctrl.links = 2, [(0, 1)]
    proc = VitalKVProcessor(attn.processor, ctrl, IMAGE_AFTER_TEXT)
    with torch.no_grad():
        plain, got = attn.processor(attn, hidden), proc(attn, hidden)
        # The injected row's attention: its own queries and text keys/values, the original's
        # image keys/values, written out.
        q, k, v = attn.to_q(hidden), attn.to_k(hidden), attn.to_v(hidden)
        k[1, text:], v[1, text:] = k[0, text:], v[0, text:]
        split = lambda t: attn.norm_k(t.unflatten(-1, (-1, attn.head_dim)))  # noqa: E731
        q, k = attn.norm_q(q.unflatten(-1, (-1, attn.head_dim))), split(k)
        v = v.unflatten(-1, (-1, attn.head_dim))
        expected = (
            torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            .transpose(1, 2)
            .flatten(2)
        )
    torch.testing.assert_close(got[0], plain[0])  # the original row is untouched
    torch.testing.assert_close(got[1], expected[1], atol=1e-5, rtol=1e-4)
    assert not torch.allclose(got[1], plain[1], atol=1e-4)


# ---- rendering ----------------------------------------------------------------------------------


def _pipeline_image(pipe, name, caption, seed, steps, guidance):
    """Diffusers' own pipeline, from the initial latents the seed's CPU generator draws."""
    side = 64 // pipe.vae_scale_factor
    channels = pipe.transformer.config.in_channels // (4 if name != "sd3" else 1)
    latents = torch.randn((1, channels, side, side), generator=torch.Generator().manual_seed(seed))
    if name != "sd3":
        latents = pipe._pack_latents(latents, 1, channels, side, side)
    image = pipe(
        caption,
        height=64,
        width=64,
        num_inference_steps=steps,
        guidance_scale=guidance,
        latents=latents,
        output_type="np",
        # FLUX at its reference T5 length (schnell 256, dev 512), which the renderer reads.
        **({} if name == "sd3" else {"max_sequence_length": flux_t5_tokens(pipe)}),
    ).images[0]
    return (image * 255).round().astype(np.uint8)


@pytest.mark.parametrize("name", ["sd3", "flux", "flux_dev"])
@pytest.mark.slow
def test_the_pair_is_the_pipelines_images(pipes, name):
    """The original image is the pipeline's image of caption_0 from the same latents, whatever p;
    with p = 0 the twin is the pipeline's image of caption_1 (no injection). (What injection does
    to the twin is tested on sharpened attention below: random-init attention barely moves it.)"""
    pipe, steps = pipes[name], 3
    specs = [PairSpec(5, 0.0, 4.0), PairSpec(6, 1.0, 6.0)]
    images_0, images_1 = generate_pairs_mmdit(pipe, *CAPTIONS, specs, steps=steps, size=64)
    for k, spec in enumerate(specs):
        assert _close(images_0[k], _pipeline_image(pipe, name, CAPTIONS[0], spec.seed, steps, spec.guidance)), k
    assert _close(images_1[0], _pipeline_image(pipe, name, CAPTIONS[1], 5, steps, 4.0))
    # The check can fail: the two captions' images differ by more than the tolerance.
    assert not _close(images_0[0], images_1[0])


@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_injection_pulls_the_twin_toward_the_original(sharp, name):
    for seed in (1, 2):
        run = {
            p: generate_pairs_mmdit(sharp[name], *CAPTIONS, [PairSpec(seed, p, 7.0)], steps=4, size=64)
            for p in (0.0, 1.0)
        }
        assert np.array_equal(run[0.0][0], run[1.0][0])  # the original never reads p
        assert not np.array_equal(run[0.0][1], run[1.0][1])
        assert _distance(*run[1.0]) < _distance(*run[0.0]), seed


@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_identical_captions_give_identical_images(pipes, name):
    images_0, images_1 = generate_pairs_mmdit(
        pipes[name], CAPTIONS[0], CAPTIONS[0], [PairSpec(3, 0.5, 5.0)], steps=3, size=64
    )
    assert np.array_equal(images_0, images_1)


#: 3 steps: p injects at steps i < 2p. p = 0.2 and 0.4 coincide on the grid (step 0 only), seed
#: 31 twice with two guidance scales (SD3 must not share them; FLUX.1-schnell ignores guidance).
SPECS = [
    PairSpec(31, 0.0, 4.0),
    PairSpec(31, 0.2, 4.0),
    PairSpec(32, 0.9, 4.0),
    PairSpec(31, 0.4, 4.0),
    PairSpec(31, 0.9, 6.0),
]


def _distinct_rows(specs, steps, halves, reads_guidance):
    rows = 0
    for i in range(steps):
        g = (lambda s: s.guidance) if reads_guidance else (lambda s: 0)
        rows += halves * (
            len({(s.seed, g(s)) for s in specs})
            + len({(s.seed, g(s), tuple(injected(s.p, k, steps) for k in range(i + 1))) for s in specs})
        )
    return rows


@pytest.mark.parametrize("name", ["sd3", "flux"])
@pytest.mark.slow
def test_candidates_do_not_depend_on_their_batch(pipes, name):
    pipe, steps = pipes[name], 3
    work = UNetWork()
    shared = generate_pairs_mmdit(pipe, *CAPTIONS, SPECS, steps=steps, size=64, work=work)
    unshared = generate_pairs_mmdit(pipe, *CAPTIONS, SPECS, steps=steps, size=64, share=False)
    for k, spec in enumerate(SPECS):
        alone = generate_pairs_mmdit(pipe, *CAPTIONS, [spec], steps=steps, size=64)
        for got in (shared, unshared):
            assert _close(got[0][k], alone[0][0]) and _close(got[1][k], alone[1][0]), (k, spec)
    assert not np.array_equal(shared[0][0], shared[0][2])  # the seed drives the latents
    halves = 2 if name == "sd3" else 1
    assert work.unet_rows == _distinct_rows(SPECS, steps, halves, name == "sd3") < halves * 2 * steps * len(SPECS)


def test_early_rejection_keeps_the_survivors_images(pipes):
    pipe, steps = pipes["flux"], 3
    full = generate_pairs_mmdit(pipe, *CAPTIONS, SPECS[:3], steps=steps, size=64)
    seen = []
    early = EarlyRejection(step=1, check=lambda a, b: (seen.append(a.shape), [True, False, True])[1])
    got = generate_pairs_mmdit(pipe, *CAPTIONS, SPECS[:3], steps=steps, size=64, early=early)
    assert early.dropped == [1] and seen == [(3, 64, 64, 3)]
    for side in (0, 1):
        assert len(got[side]) == 2
        assert _close(got[side][0], full[side][0]) and _close(got[side][1], full[side][2])


def test_a_unet_pipeline_is_refused_in_one_line(tiny_models_dir):
    from builders.models.loaders import load_sd
    from builders.models.profiles import resolve_profile

    pipe = load_sd(resolve_profile("tiny", tiny_models_dir).sd)
    with pytest.raises(UserFacingError, match="StableDiffusion3Pipeline or a FluxPipeline"):
        generate_pairs_mmdit(pipe, *CAPTIONS, [PairSpec(1, 0.5, 7.5)], steps=2, size=64)


@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_an_image_size_the_latents_cannot_take_is_one_line(pipes, name):
    # The tiny VAE halves the side twice and both families split the latents 2 x 2: 8 px.
    with pytest.raises(UserFacingError, match=r"--image-size 60: .* multiple of 8 pixels; give 56 or 64"):
        generate_pairs_mmdit(pipes[name], *CAPTIONS, [PairSpec(1, 0.5, 7.5)], steps=2, size=60)


def test_tiny_pipelines_are_built_alike_every_time(tiny_dir, tmp_path):
    from builders.models.tiny_mmdit import build_tiny_flux, build_tiny_sd3

    for name, build in (("sd3", build_tiny_sd3), ("flux", build_tiny_flux)):
        again = build(tmp_path / name)
        files = sorted(p.relative_to(tiny_dir[name]) for p in tiny_dir[name].rglob("*") if p.is_file())
        assert any(str(f).endswith(".safetensors") for f in files)
        assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
        for f in files:
            assert (tiny_dir[name] / f).read_bytes() == (again / f).read_bytes(), f
