"""A tiny random-init SDXL pipeline, saved as `StableDiffusionXLPipeline.save_pretrained` does.

The same parts as SDXL base at toy sizes, so the tiny profile runs `--generator sdxl` through
the code paths the real model takes (`builders.models.loaders.load_generator`,
`builders.counterfactuals.prompt_to_prompt_xl`), offline and deterministic: a UNet with
`addition_embed_type="text_time"` (pooled text embedding + micro-conditioning), multi-layer
transformer blocks as SDXL's, two CLIP text encoders (the second with a projection, whose pooled
output the UNet reads), two offline CLIP tokenizers (the second pads with `!`, as SDXL's
OpenCLIP tokenizer), an fp16-upcasting VAE and SDXL's Euler scheduler configuration.
"""

from __future__ import annotations

from pathlib import Path

import torch

from builders.models.tiny import SEED, clip_tokenizer, clip_text_config

#: Text encoders' widths: the UNet's cross-attention reads both, concatenated per token.
_TEXT_WIDTH, _TEXT_2_WIDTH, _PROJECTION = 32, 32, 32
#: The UNet's embedding of each of the 6 micro-conditioning numbers (SDXL base: 256).
_TIME_EMBED = 8


def _unet():
    """SDXL's UNet at toy sizes: `text_time` added conditioning (the second encoder's pooled
    output and the 6 micro-conditioning numbers) and multi-layer transformer blocks."""
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        block_out_channels=(8, 16),
        layers_per_block=1,
        sample_size=32,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        transformer_layers_per_block=(1, 2),
        use_linear_projection=True,
        cross_attention_dim=_TEXT_WIDTH + _TEXT_2_WIDTH,
        addition_embed_type="text_time",
        addition_time_embed_dim=_TIME_EMBED,
        projection_class_embeddings_input_dim=6 * _TIME_EMBED + _PROJECTION,
        norm_num_groups=2,
    )


def _text_encoders() -> dict:
    """SDXL's two CLIP text encoders with their tokenizers, as pipeline components: the second
    encoder has a projection (its pooled output is what the UNet reads) and its tokenizer pads
    with `!`, as SDXL's OpenCLIP tokenizer."""
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    tokenizer = clip_tokenizer()
    tokenizer_2 = clip_tokenizer()
    tokenizer_2.pad_token = "!"
    text = clip_text_config(len(tokenizer))
    text.hidden_size, text.projection_dim = _TEXT_WIDTH, _PROJECTION
    text_2 = clip_text_config(len(tokenizer_2))
    text_2.hidden_size, text_2.projection_dim = _TEXT_2_WIDTH, _PROJECTION
    text_encoder = CLIPTextModel(text)
    text_encoder_2 = CLIPTextModelWithProjection(text_2)
    return dict(text_encoder=text_encoder, text_encoder_2=text_encoder_2, tokenizer=tokenizer, tokenizer_2=tokenizer_2)


def build_tiny_sdxl(out: str | Path) -> None:
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline

    # One seeded stream, drawn in this order: the UNet, the VAE, then the text encoders.
    torch.manual_seed(SEED)
    unet = _unet()
    vae = AutoencoderKL(
        block_out_channels=[4, 8],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2,
        latent_channels=4,
        norm_num_groups=2,
        scaling_factor=0.13025,
        force_upcast=True,
    )
    text = _text_encoders()
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        steps_offset=1,
        timestep_spacing="leading",
        prediction_type="epsilon",
    )
    pipe = StableDiffusionXLPipeline(
        vae=vae,
        unet=unet,
        scheduler=scheduler,
        force_zeros_for_empty_prompt=True,
        add_watermarker=False,
        **text,
    )
    pipe.save_pretrained(out)
