"""Tiny random-init SD3 and FLUX pipelines for tests and the tiny profile (offline, deterministic).

The same component classes as stabilityai/stable-diffusion-3-medium-diffusers and
black-forest-labs/FLUX.1-schnell (SD3Transformer2DModel / FluxTransformer2DModel, CLIP text
encoders, a T5 encoder, an AutoencoderKL with shift and scaling factors, the flow-matching Euler
scheduler) at a few thousand parameters each, saved with `save_pretrained`, so they load through
`StableDiffusion3Pipeline.from_pretrained` / `FluxPipeline.from_pretrained` as the real ones do.
Each renders a 64 px pair in seconds on a CPU (flux: 256 T5 tokens, as FLUX.1-schnell; 512 with a guidance embedding, as FLUX.1-dev).

Tokenizers are built offline: the CLIP ones are `builders.models.tiny`'s character-level CLIP
tokenizer, the T5 one a unigram vocabulary of single characters (transformers' T5 tokenizer
accepts a `(piece, score)` list, so no sentencepiece file is needed).
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

from builders.models.tiny import SEED, clip_tokenizer, clip_text_config

#: The tiny VAE halves the side twice: 64 px images are 16 x 16 latents.
_VAE_BLOCKS = (8, 8, 8)


def _t5_tokenizer():
    from transformers import T5TokenizerFast

    chars = string.ascii_letters + string.digits + string.punctuation
    pieces = (
        [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
        + [(c, -3.0) for c in chars]
        + [("\u2581" + c, -2.5) for c in chars]
    )
    return T5TokenizerFast(vocab=pieces, extra_ids=0)


def _t5_encoder(vocab_size: int, d_model: int):
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(SEED)
    return T5EncoderModel(
        T5Config(
            vocab_size=vocab_size,
            d_model=d_model,
            d_ff=64,
            d_kv=8,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=1,
        )
    )


def _clip_text(with_projection: bool, vocab_size: int):
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(SEED + int(with_projection))
    cfg = clip_text_config(vocab_size)
    cfg.projection_dim = 32  # the pooled width the tiny transformers take (2 x 32 for SD3)
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(cfg)


def _vae(shift_factor: float, scaling_factor: float):
    from diffusers import AutoencoderKL

    torch.manual_seed(SEED)
    # SD3's and FLUX's VAEs: no quant convs, latents shifted then scaled.
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        block_out_channels=_VAE_BLOCKS,
        down_block_types=["DownEncoderBlock2D"] * len(_VAE_BLOCKS),
        up_block_types=["UpDecoderBlock2D"] * len(_VAE_BLOCKS),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=64,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=shift_factor,
        scaling_factor=scaling_factor,
    )


def build_tiny_sd3(out_dir: str | Path) -> Path:
    """A tiny StableDiffusion3Pipeline in `out_dir`: 4 joint blocks (so the vital-layer map
    leaves some untouched), two CLIP-with-projection encoders, a T5 encoder."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    clip_tok = clip_tokenizer()
    t5_tok = _t5_tokenizer()
    torch.manual_seed(SEED)
    # joint_attention_dim = T5's width = the two CLIP widths side by side (SD3 pads CLIP to T5).
    transformer = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=4,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=64,
        caption_projection_dim=32,
        pooled_projection_dim=64,
        pos_embed_max_size=16,
    )
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=_vae(shift_factor=0.0609, scaling_factor=1.5305),
        text_encoder=_clip_text(True, len(clip_tok)),
        tokenizer=clip_tok,
        text_encoder_2=_clip_text(True, len(clip_tok)),
        tokenizer_2=clip_tokenizer(),
        text_encoder_3=_t5_encoder(len(t5_tok), 64),
        tokenizer_3=t5_tok,
    )
    pipe.save_pretrained(out_dir)
    return Path(out_dir)


def build_tiny_flux(out_dir: str | Path, *, guidance_embeds: bool = False) -> Path:
    """A tiny FluxPipeline in `out_dir`: 2 double- and 4 single-stream blocks, CLIP + T5. Like
    FLUX.1-schnell without guidance; `guidance_embeds=True` makes it FLUX.1-dev-like."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    clip_tok = clip_tokenizer()
    t5_tok = _t5_tokenizer()
    torch.manual_seed(SEED)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=2,
        num_single_layers=4,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=guidance_embeds,
        axes_dims_rope=(4, 6, 6),
    )
    # FLUX.1-schnell's scheduler config (dev: use_dynamic_shifting=True, shift=3.0).
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0 if guidance_embeds else 1.0,
        use_dynamic_shifting=guidance_embeds,
        base_image_seq_len=256,
        max_image_seq_len=4096,
        base_shift=0.5,
        max_shift=1.15,
    )
    pipe = FluxPipeline(
        transformer=transformer,
        scheduler=scheduler,
        vae=_vae(shift_factor=0.1159, scaling_factor=0.3611),
        text_encoder=_clip_text(False, len(clip_tok)),
        tokenizer=clip_tok,
        text_encoder_2=_t5_encoder(len(t5_tok), 32),
        tokenizer_2=t5_tok,
    )
    pipe.save_pretrained(out_dir)
    return Path(out_dir)
