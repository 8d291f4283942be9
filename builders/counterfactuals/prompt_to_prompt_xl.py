"""Prompt-to-Prompt image pairs on SDXL (builders/counterfactuals/METHOD.md §2, "Generators").

`generate_pairs_xl` is `prompt_to_prompt.generate_pairs` for a `StableDiffusionXLPipeline`: the
same candidates (`PairSpec`), shared initial and sampler noise, injection rule, `--inject` modes,
shared computation and early rejection, run by the same denoising loop and attention processors
(`prompt_to_prompt.denoise_pairs`, `P2PController`, `P2PAttnProcessor`). What SDXL adds is
read through diffusers' own pipeline:

- **Two text encoders.** `pipe.encode_prompt` concatenates the penultimate hidden states of
  CLIP ViT-L and OpenCLIP bigG per token (77 positions, 768 + 1280 features): the UNet's
  cross-attention keys. The word-swap mapper aligns those 77 positions, which both tokenizers
  split alike (the same BPE; they differ only in the padding token).
- **Pooled embeddings.** bigG's projected end-of-text embedding enters every UNet row through
  `added_cond_kwargs["text_embeds"]`, per caption and guidance half, as the pipeline batches it
  (the unconditional half gets the pipeline's own: zeros for SDXL base,
  `force_zeros_for_empty_prompt`).
- **Micro-conditioning.** `added_cond_kwargs["time_ids"]`: original size, crop corner (0, 0) and
  target size, all `size` x `size` (`pipe._get_add_time_ids`), the same for every row.
- **VAE upcasting.** SDXL's VAE overflows in fp16: with `force_upcast` in its config (SDXL
  base), latents are decoded in float32 and the VAE is cast back, as the pipeline does; latents
  are un-normalised with the VAE's `latents_mean`/`latents_std` where its config has them.

The cross mode's low-resolution self-attention layers are those of at most (latent side / 4)^2
query positions, as for SD v1.5: at 1024 px (128 x 128 latents) the 32 x 32 layers, SDXL's
10-deep transformer blocks (down_blocks.2, the mid block, up_blocks.0).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from builders.counterfactuals.prompt_to_prompt import (
    EarlyRejection,
    PairSpec,
    Prompts,
    UNetWork,
    denoise_pairs,
    to_uint8,
)
from builders.counterfactuals.word_swap import word_swap_mapper


def decode_xl(pipe, latents: torch.Tensor) -> np.ndarray:
    """SDXL's VAE decode as the pipeline does it: in float32 when its fp16 VAE asks for it."""
    vae = pipe.vae
    upcast = vae.dtype == torch.float16 and vae.config.force_upcast
    if upcast:
        vae.to(dtype=torch.float32)
    try:
        latents = latents.to(next(iter(vae.post_quant_conv.parameters())).dtype)
        mean, std = getattr(vae.config, "latents_mean", None), getattr(vae.config, "latents_std", None)
        if mean is not None and std is not None:
            mean = torch.tensor(mean).view(1, -1, 1, 1).to(latents.device, latents.dtype)
            std = torch.tensor(std).view(1, -1, 1, 1).to(latents.device, latents.dtype)
            latents = latents * std / vae.config.scaling_factor + mean
        else:
            latents = latents / vae.config.scaling_factor
        return to_uint8(vae.decode(latents).sample)
    finally:
        if upcast:
            vae.to(dtype=torch.float16)


def xl_prompts(pipe, caption_0: str, caption_1: str, size: int) -> Prompts:
    """Both captions through SDXL's two text encoders, with the pooled embeddings and the
    micro-conditioning every UNet row of their caption reads."""
    device = pipe._execution_device
    cond, uncond, pooled, uncond_pooled = pipe.encode_prompt(
        [caption_0, caption_1], device=device, num_images_per_prompt=1, do_classifier_free_guidance=True
    )
    projection = (
        pipe.text_encoder_2.config.projection_dim if pipe.text_encoder_2 is not None else int(pooled.shape[-1])
    )
    time_ids = pipe._get_add_time_ids(
        (size, size), (0, 0), (size, size), dtype=cond.dtype, text_encoder_projection_dim=projection
    ).to(device)

    def added(caption: list[int]) -> dict:
        return {
            "text_embeds": torch.cat([uncond_pooled[caption], pooled[caption]]),
            "time_ids": time_ids.repeat(2 * len(caption), 1),
        }

    return Prompts(cond, uncond, added)


@torch.inference_mode()
def generate_pairs_xl(
    pipe,
    caption_0: str,
    caption_1: str,
    specs: Sequence[PairSpec],
    *,
    steps: int,
    size: int,
    inject: str = "self",
    scheduler: str = "euler_ancestral",
    share: bool = True,
    work: UNetWork | None = None,
    early: EarlyRejection | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`prompt_to_prompt.generate_pairs` on an SDXL pipeline (module docstring)."""
    prompts = xl_prompts(pipe, caption_0, caption_1, size)
    tokenizer = pipe.tokenizer if pipe.tokenizer is not None else pipe.tokenizer_2
    mapper = word_swap_mapper(tokenizer, caption_0, caption_1, prompts.cond.shape[1], inject)
    return denoise_pairs(
        pipe,
        prompts,
        specs,
        steps=steps,
        size=size,
        inject=inject,
        mapper=mapper,
        scheduler=scheduler,
        share=share,
        work=work,
        early=early,
        decode=decode_xl,
    )
