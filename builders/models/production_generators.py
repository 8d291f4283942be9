"""The real architectures of the image stage's generators beyond SD v1.5 (`--generator sdxl|sd3|
flux`), written down as public facts like `production_configs` (which holds SD v1.5's): the
SDXL base 1.0 UNet and its two text encoders, the SD3-medium MMDiT with CLIP-L, CLIP-G and
T5-XXL, the FLUX.1-schnell transformer with CLIP-L and T5-XXL, and their VAEs.

`production_configs.build_empty(arch)` builds any of them on the meta device (shapes, no weight
memory): tests/models/test_production_shapes.py checks each against its published parameter count, and
`counterfactory doctor` computes each generator's weights and activation memory from them
(builders/devtools/doctor_generators.py) where the model is too large to build here.

Each config is the component's `config.json` in the diffusers layout of the default Hub model
(cited per entry), architecture fields only. Where the model card states the count only to
its leading digits ("2.6B", "12 billion"), the tolerance is that precision; where the Hub lists
the checkpoint file's size, the count is size / bytes per parameter, to the size's precision.
"""

from __future__ import annotations

from builders.models.production_configs import (
    CLIP_L14_TEXT,
    CLIP_TEXT,
    CLIP_TEXT_PROJ,
    FLUX_TRANSFORMER,
    SD3_TRANSFORMER,
    SD_VAE,
    T5_ENCODER,
    UNET,
    VAE,
    ProductionArch,
)


SDXL_ID = "stabilityai/stable-diffusion-xl-base-1.0"
SD3_ID = "stabilityai/stable-diffusion-3-medium-diffusers"
FLUX_ID = "black-forest-labs/FLUX.1-schnell"

# stable-diffusion-xl-base-1.0 unet/config.json: no attention at the highest level, 2 and 10
# transformer blocks at the lower two, no 8x level; 2048-wide context (CLIP-L 768 + bigG 1280);
# `text_time` micro-conditioning: pooled bigG (1280) + 6 size/crop ids x 256 = 2816.
SDXL_UNET = {
    "sample_size": 128,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "block_out_channels": [320, 640, 1280],
    "layers_per_block": 2,
    "attention_head_dim": [5, 10, 20],
    "transformer_layers_per_block": [1, 2, 10],
    "cross_attention_dim": 2048,
    "use_linear_projection": True,
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 256,
    "addition_embed_type_num_heads": 64,
    "projection_class_embeddings_input_dim": 2816,
    "norm_num_groups": 32,
    "norm_eps": 1e-5,
    "act_fn": "silu",
    "downsample_padding": 1,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "center_input_sample": False,
    "mid_block_scale_factor": 1,
    "mid_block_type": "UNetMidBlock2DCrossAttn",
}
# stable-diffusion-xl-base-1.0 vae/config.json: SD v1.5's AutoencoderKL architecture, retrained
# (scaling factor 0.13025; `force_upcast`: its fp16 decode overflows, the pipeline decodes in fp32).
SDXL_VAE = {**SD_VAE, "sample_size": 1024, "scaling_factor": 0.13025, "force_upcast": True}
# stable-diffusion-xl-base-1.0 text_encoder_2/config.json (CLIPTextModelWithProjection): the
# OpenCLIP ViT-bigG/14 text tower (laion/CLIP-ViT-bigG-14-laion2B-39B-b160k), GELU, 1280-wide
# projection of the pooled token.
CLIP_BIGG_TEXT = {
    "vocab_size": 49408,
    "hidden_size": 1280,
    "intermediate_size": 5120,
    "num_hidden_layers": 32,
    "num_attention_heads": 20,
    "max_position_embeddings": 77,
    "hidden_act": "gelu",
    "projection_dim": 1280,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 1,
}
# stable-diffusion-3-medium-diffusers text_encoder_3/config.json (and FLUX.1-schnell
# text_encoder_2/config.json): the encoder of google/t5-v1_1-xxl (T5EncoderModel).
T5_XXL_ENCODER = {
    "vocab_size": 32128,
    "d_model": 4096,
    "d_kv": 64,
    "d_ff": 10240,
    "num_layers": 24,
    "num_heads": 64,
    "feed_forward_proj": "gated-gelu",
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "layer_norm_epsilon": 1e-6,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "eos_token_id": 1,
}
# stable-diffusion-3-medium-diffusers transformer/config.json (SD3Transformer2DModel): 24 joint
# blocks of 24 heads x 64 = 1536, 2x2 patches of the 16-channel latent, T5's 4096-wide tokens
# projected in, pooled CLIP-L + CLIP-G (768 + 1280 = 2048).
SD3_MEDIUM_TRANSFORMER = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 16,
    "out_channels": 16,
    "num_layers": 24,
    "attention_head_dim": 64,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 1536,
    "pooled_projection_dim": 2048,
    "pos_embed_max_size": 192,
}
# stable-diffusion-3-medium-diffusers vae/config.json: SD's AutoencoderKL with 16 latent channels
# and neither quant_conv nor post_quant_conv.
SD3_VAE = {
    **SD_VAE,
    "sample_size": 1024,
    "latent_channels": 16,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
    "scaling_factor": 1.5305,
    "shift_factor": 0.0609,
}
# FLUX.1-schnell transformer/config.json (FluxTransformer2DModel): 19 double-stream and 38
# single-stream blocks of 24 heads x 128 = 3072; packed 2x2 latent patches (16 x 4 = 64 inputs);
# no guidance embedding (schnell is timestep-distilled; FLUX.1-dev has `guidance_embeds`).
FLUX_SCHNELL_TRANSFORMER = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": False,
    "axes_dims_rope": [16, 56, 56],
}
# FLUX.1-schnell vae/config.json: the SD3 VAE's architecture with its own scale and shift.
FLUX_VAE = {**SD3_VAE, "scaling_factor": 0.3611, "shift_factor": 0.1159}

# Published counts shared by several generators.
_CLIP_L_TEXT = (
    123.06e6,
    "SD v1.5 model card (CLIP ViT-L/14 text encoder, 123M; production_configs `sd.text_encoder`: 123,060,480)",
)
_BIGG_TEXT = (
    694.66e6,
    "SDXL paper (Podell et al. 2023) Table 1: text encoders 817M = CLIP "
    "ViT-L 123M + OpenCLIP bigG; open_clip model profile ViT-bigG-14 text tower "
    "694.66M; SD3-medium text_encoders/clip_g.safetensors 1.39 GB in fp16",
)
# The checkpoint stores T5's tied input embedding twice (`shared` and `encoder.embed_tokens`):
# 4.894B tensors x 2 bytes = 9.79 GB; 4.762B distinct.
_T5_XXL = (
    4.894e9,
    "stable-diffusion-3-medium text_encoders/t5xxl_fp16.safetensors: 9.79 GB "
    "in fp16 = 4.89B tensors, the 32128 x 4096 tied embedding stored twice (4.76B distinct)",
)
# SD v1.5's VAE (83,653,863, production_configs `sd.vae`) with 16 instead of 4 latent channels
# and no quant convs: - (8x8+8) - (4x4+4) + 512x(32-8)x3x3 + (32-8) + (16-4)x512x3x3.
_VAE16 = (
    83_653_863 - 72 - 20 + 110_592 + 24 + 55_296,
    "SD v1.5 VAE's 83,653,863 parameters with the 16-channel latent written out (encoder "
    "conv_out +110,616, decoder conv_in +55,296, no quant convs -92); FLUX.1 ae.safetensors "
    "335 MB in fp32 = 83.8M",
)

GENERATOR_ARCHS: tuple[ProductionArch, ...] = (
    ProductionArch(
        "sdxl.unet",
        SDXL_ID,
        UNET,
        SDXL_UNET,
        2.6e9,
        0.05 / 2.6,
        "SDXL paper Table 1: #UNet params 2.6B (stated to 0.1B); unet config.json",
    ),
    ProductionArch(
        "sdxl.text_encoder",
        SDXL_ID,
        CLIP_TEXT,
        CLIP_L14_TEXT,
        _CLIP_L_TEXT[0],
        0.001,
        _CLIP_L_TEXT[1] + "; SDXL text_encoder/config.json",
    ),
    ProductionArch(
        "sdxl.text_encoder_2", SDXL_ID, CLIP_TEXT_PROJ, CLIP_BIGG_TEXT, _BIGG_TEXT[0], 0.005, _BIGG_TEXT[1]
    ),
    ProductionArch(
        "sdxl.vae",
        SDXL_ID,
        VAE,
        SDXL_VAE,
        83_653_863,
        0.001,
        "SD v1.5 vae (83,653,863 parameters), the same architecture in SDXL vae/config.json",
    ),
    ProductionArch(
        "sd3.transformer",
        SD3_ID,
        SD3_TRANSFORMER,
        SD3_MEDIUM_TRANSFORMER,
        2e9,
        0.5e8 / 2e9,
        "SD3-medium model card / Stability AI release: a 2 billion "
        "parameter MMDiT (stated to 0.1B); transformer/config.json",
    ),
    # CLIP ViT-L/14's text tower with its 768 x 768 text projection (CLIPTextModelWithProjection;
    # SDXL and FLUX load the same weights without it).
    ProductionArch(
        "sd3.text_encoder",
        SD3_ID,
        CLIP_TEXT_PROJ,
        CLIP_L14_TEXT,
        _CLIP_L_TEXT[0] + 768 * 768,
        0.001,
        _CLIP_L_TEXT[1] + " + the 768 x 768 text projection of "
        "openai/clip-vit-large-patch14; SD3 text_encoder/config.json",
    ),
    ProductionArch(
        "sd3.text_encoder_2",
        SD3_ID,
        CLIP_TEXT_PROJ,
        CLIP_BIGG_TEXT,
        _BIGG_TEXT[0],
        0.005,
        _BIGG_TEXT[1] + "; SD3 text_encoder_2/config.json",
    ),
    ProductionArch(
        "sd3.text_encoder_3",
        SD3_ID,
        T5_ENCODER,
        T5_XXL_ENCODER,
        _T5_XXL[0],
        0.001,
        _T5_XXL[1] + "; SD3 text_encoder_3/config.json",
        counts_tied_copies=True,
    ),
    ProductionArch("sd3.vae", SD3_ID, VAE, SD3_VAE, _VAE16[0], 0.001, _VAE16[1] + "; SD3 vae/config.json"),
    ProductionArch(
        "flux.transformer",
        FLUX_ID,
        FLUX_TRANSFORMER,
        FLUX_SCHNELL_TRANSFORMER,
        11.9e9,
        0.005,
        "FLUX.1-schnell model card: a 12 billion parameter rectified "
        "flow transformer; flux1-schnell.safetensors 23.8 GB in bf16 = 11.9B; "
        "transformer/config.json",
    ),
    ProductionArch(
        "flux.text_encoder",
        FLUX_ID,
        CLIP_TEXT,
        CLIP_L14_TEXT,
        _CLIP_L_TEXT[0],
        0.001,
        _CLIP_L_TEXT[1] + "; FLUX.1-schnell text_encoder/config.json",
    ),
    ProductionArch(
        "flux.text_encoder_2",
        FLUX_ID,
        T5_ENCODER,
        T5_XXL_ENCODER,
        _T5_XXL[0],
        0.001,
        _T5_XXL[1] + "; FLUX.1-schnell text_encoder_2/config.json",
        counts_tied_copies=True,
    ),
    ProductionArch(
        "flux.vae", FLUX_ID, VAE, FLUX_VAE, _VAE16[0], 0.001, _VAE16[1] + "; FLUX.1-schnell vae/config.json"
    ),
)
GENERATOR_ARCH = {arch.name: arch for arch in GENERATOR_ARCHS}

#: Generator name (`--generator`) -> its pipeline's components, the denoiser first and the VAE
#: last (sd15's are `production_configs.ARCHS`).
GENERATOR_COMPONENTS: dict[str, tuple[str, ...]] = {
    "sd15": ("sd.unet", "sd.text_encoder", "sd.vae"),
    "sdxl": ("sdxl.unet", "sdxl.text_encoder", "sdxl.text_encoder_2", "sdxl.vae"),
    "sd3": ("sd3.transformer", "sd3.text_encoder", "sd3.text_encoder_2", "sd3.text_encoder_3", "sd3.vae"),
    "flux": ("flux.transformer", "flux.text_encoder", "flux.text_encoder_2", "flux.vae"),
}


def arch(name: str) -> ProductionArch:
    """A component by name, from either table (`sd.unet`, `flux.transformer`, ...)."""
    from builders.models.production_configs import ARCHS

    return GENERATOR_ARCH.get(name) or ARCHS[name]
