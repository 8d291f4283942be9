"""Edited twins on MM-DiTs (SD3, FLUX): Stable Flow's vital-layer attention injection
(builders/counterfactuals/METHOD.md §6).

In an MM-DiT text and image tokens share one joint attention, so there is no cross-attention map
for Prompt-to-Prompt to swap. Stable Flow (Avrahami et al., CVPR 2025, arXiv 2411.14430, §3.2)
generates the original and the edited image in parallel from the same initial noise and, in a
few "vital" layers only, replaces the *image-token keys and values* of the edited image by the
original's; the text tokens keep their own, so the new caption still steers the edit.

`generate_pairs_mmdit(pipe, caption_0, caption_1, specs, ...)` is the MM-DiT counterpart of
`prompt_to_prompt.generate_pairs` (same contract, same `PairSpec`, `UNetWork`,
`EarlyRejection`): N candidate pairs in one transformer batch, rows `[o_1, c_1, o_2, c_2, ...]`
(twice, `[uncond | cond]`, under SD3's classifier-free guidance). Each pair's two images start
from the same initial latents, drawn in float32 from a CPU generator seeded by the candidate's
seed; the flow-matching Euler sampler is deterministic, so nothing else is drawn. A candidate's
images depend on its own spec only, never on its batch position.

- `p` (PairSpec.p) is the fraction of the denoising steps that inject, with the
  Prompt-to-Prompt rule of METHOD.md §2: pair j injects at step i while `p_j > i / (steps - 1)`
  (p = 0 never, p = 1 every step but the last). Stable Flow injects at every step; p lets the
  over-generate-and-filter loop trade faithfulness to the original against the edit.
- `guidance` is SD3's classifier-free guidance scale, FLUX.1-dev's guidance embedding, and is
  not read by FLUX.1-schnell (no guidance at all: its candidates share more, see `_key_specs`).
- `share` and `early` work as in prompt_to_prompt.py: the transformer sees each distinct row
  state once per step (the original branch does not read p; counterfactual branches fork where
  their injection prefixes part), and early rejection previews the sampler's x0 prediction
  `x_t - sigma_t * v` (rectified flow) through the VAE.

Which layers inject is `vital_layer_map(transformer.config)`; every other attention layer keeps
diffusers' own processor, and the injecting ones run diffusers' own processor too, with the
key/value projections' outputs of the edited rows replaced (forward hooks on `to_k`/`to_v`),
before QK-norm and RoPE, as Stable Flow does (both images have the same token positions).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

import numpy as np
import torch

from builders.counterfactuals.model_references import check_loaded
from builders.counterfactuals.vital_layers_file import block_names, published_elsewhere
from builders.counterfactuals.prompt_to_prompt import (
    EarlyRejection,
    PairSpec,
    UNetWork,
    _dedupe,
    _generators,
    final_pairs,
    injected,
    row_keys,
)
from builders.engine.errors import UserFacingError
from builders.engine.option_types import check_image_side

#: Stable Flow's vital layers, at the depth they were measured (Avrahami et al. 2025, §3.1 and
#: App. A; FLUX indices as in the authors' code, snap-research/stable-flow `run_stable_flow.py`).
#: FLUX.1-dev: blocks 0, 1, 17, 18 of the 19 double-stream blocks and 25, 28, 53, 54, 56 of all
#: 57, i.e. single-stream blocks 6, 9, 34, 35, 37 (the paper's list also has block 2, which the
#: authors' code leaves out). SD3: joint blocks 0, 7, 8, 9 of SD3-medium's 24, UNMEASURED: no
#: checked source (Stable Flow's code has an SD3 hook but passes it no layers; "7, 8, 9" is also
#: Stability AI's skip-layer guidance of SD3.5-medium, another model and mechanism). Measure them
#: with `counterfactory doctor vital-layers` and pass `--vital-layers`.
FLUX_DOUBLE_VITAL, FLUX_DOUBLE_DEPTH = (0, 1, 17, 18), 19
FLUX_SINGLE_VITAL, FLUX_SINGLE_DEPTH = (6, 9, 34, 35, 37), 38
SD3_VITAL, SD3_DEPTH = (0, 7, 8, 9), 24


def vital_layers_record(
    generator: str, layers: Sequence[int], provenance: dict | None, model: str | None = None
) -> dict:
    """What the manifest and card say about the layers that inject: the given ones and what
    measured them, or the published set by its source (SD3's: unmeasured), and where `model`
    (the build's known model, None: an unknown variant) is not the one it was measured on, so."""
    if layers:
        return {"layers": list(layers), "provenance": provenance or "given by --vital-layers (unmeasured here)"}
    if generator == "flux":
        published = [*FLUX_DOUBLE_VITAL, *(FLUX_DOUBLE_DEPTH + i for i in FLUX_SINGLE_VITAL)]
        source = "Stable Flow's set (Avrahami et al. 2025; snap-research/stable-flow run_stable_flow.py)"
        elsewhere = published_elsewhere(generator, model)
        source += f", {elsewhere}" if elsewhere else ", measured on this model"
    else:
        published = list(SD3_VITAL)
        source = "UNMEASURED: no checked source; measure with `counterfactory doctor vital-layers`"
    # A transformer of another depth (the tiny one) injects the same relative depths.
    return {"layers": published, "provenance": f"{source}; rescaled for other depths"}


#: What the injected layer's `to_k`/`to_v` read: the image stream alone (SD3's joint blocks and
#: FLUX's double-stream blocks project text through `add_k_proj`/`add_v_proj`), or the text
#: tokens followed by the image tokens (FLUX's single-stream blocks).
IMAGE = "image"
IMAGE_AFTER_TEXT = "image_after_text"


def scaled_layers(vital: Sequence[int], published_depth: int, depth: int) -> tuple[int, ...]:
    """The vital indices at the depth they were measured; for another depth (a tiny test model,
    a deeper variant) the same relative depths, rounded (a deviation: vital layers are a property
    of the trained model, so only the published depths are the paper's)."""
    if depth == published_depth:
        return tuple(vital)
    if depth < 1:
        return ()
    return tuple(sorted({round(i * (depth - 1) / (published_depth - 1)) for i in vital}))


def vital_layer_map(config, layers: Sequence[int] | None = None) -> dict[str, str]:
    """{attention processor name: IMAGE | IMAGE_AFTER_TEXT} of the layers that inject, from a
    transformer's config (FLUX: `num_layers` double- and `num_single_layers` single-stream blocks;
    SD3: `num_layers` JointTransformerBlocks, their joint attention `attn` only: a dual-attention
    block's image-only `attn2` keeps its own keys and values). `layers`: block indices of
    `block_names` (`--vital-layers`) instead of the published ones."""
    if layers is not None:
        names = block_names(config)
        wrong = [i for i in layers if not 0 <= i < len(names)]
        if wrong:
            raise UserFacingError(
                f"--vital-layers {wrong[0]}: this transformer has blocks 0..{len(names) - 1} "
                "(FLUX: double-stream blocks first, then single-stream ones, as Stable Flow numbers them)"
            )
        return {
            f"{names[i]}.attn.processor": IMAGE_AFTER_TEXT if names[i].startswith("single") else IMAGE
            for i in sorted(set(layers))
        }
    if "num_single_layers" in config:
        double = scaled_layers(FLUX_DOUBLE_VITAL, FLUX_DOUBLE_DEPTH, config["num_layers"])
        single = scaled_layers(FLUX_SINGLE_VITAL, FLUX_SINGLE_DEPTH, config["num_single_layers"])
        return {
            **{f"transformer_blocks.{i}.attn.processor": IMAGE for i in double},
            **{f"single_transformer_blocks.{i}.attn.processor": IMAGE_AFTER_TEXT for i in single},
        }
    if "caption_projection_dim" in config and "num_layers" in config:
        return {
            f"transformer_blocks.{i}.attn.processor": IMAGE
            for i in scaled_layers(SD3_VITAL, SD3_DEPTH, config["num_layers"])
        }
    raise ValueError("not an SD3 or FLUX transformer config: no num_layers/num_single_layers")


class KVController:
    """Shared state of the processors: the current step's links (original row, edited row)
    inside one half of `half` rows, how many halves the batch has (2 under classifier-free
    guidance: `[uncond | cond]`, both injected) and the text length (FLUX single blocks)."""

    def __init__(self, halves: int, text_tokens: int) -> None:
        self.halves, self.text_tokens = halves, text_tokens
        self.half = 0
        self.links: list[tuple[int, int]] = []

    def rows(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(source rows, edited rows) of the pairs injecting at this step, over every half."""
        if not self.links:
            return None
        src = torch.tensor([h * self.half + o for h in range(self.halves) for o, _ in self.links])
        dst = torch.tensor([h * self.half + c for h in range(self.halves) for _, c in self.links])
        return src, dst


class VitalKVProcessor:
    """Diffusers' own processor `inner`, with the edited rows' image-token keys and values
    replaced by their original rows' (Stable Flow's injection)."""

    def __init__(self, inner, controller: KVController, tokens: str) -> None:
        self.inner, self.ctrl, self.tokens = inner, controller, tokens

    def __call__(self, attn, hidden_states, *args, **kwargs):
        rows = self.ctrl.rows()
        if rows is None:
            return self.inner(attn, hidden_states, *args, **kwargs)
        if getattr(attn, "fused_projections", False):
            # A fused to_qkv never calls to_k/to_v, so nothing would be injected.
            raise ValueError(
                "vital-layer injection needs unfused attention projections (call transformer.unfuse_qkv_projections())"
            )
        src, dst = rows
        start = self.ctrl.text_tokens if self.tokens == IMAGE_AFTER_TEXT else 0

        def inject(_module, _inputs, out):
            out = out.clone()
            out[dst, start:] = out[src, start:]
            return out

        hooks = [attn.to_k.register_forward_hook(inject), attn.to_v.register_forward_hook(inject)]
        try:
            return self.inner(attn, hidden_states, *args, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()


@contextlib.contextmanager
def vital_processors(
    transformer, controller: KVController, vital: Sequence[int] | None = None
) -> Iterator[dict[str, str]]:
    """Wrap the processors of `vital_layer_map(transformer.config, vital)`; every other layer
    keeps its own (the very same object). Restores the previous processors afterwards."""
    previous = transformer.attn_processors
    layers = vital_layer_map(transformer.config, vital)
    missing = sorted(set(layers) - set(previous))
    if missing:
        raise ValueError(f"the transformer has no attention layer {missing[0]}")
    transformer.set_attn_processor(
        {
            name: VitalKVProcessor(proc, controller, layers[name]) if name in layers else proc
            for name, proc in previous.items()
        }
    )
    try:
        yield layers
    finally:
        transformer.set_attn_processor(previous)


def family(pipe) -> str:
    """`sd3` or `flux`, from the pipeline's transformer class."""
    name = type(getattr(pipe, "transformer", None)).__name__
    if name == "SD3Transformer2DModel":
        return "sd3"
    if name == "FluxTransformer2DModel":
        return "flux"
    raise UserFacingError(
        f"the MM-DiT generators need a StableDiffusion3Pipeline or a FluxPipeline "
        f"(got a {type(pipe).__name__} with a {name} denoiser); use --generator "
        f"sd15 or sdxl for UNet models"
    )


@dataclass
class _Conditioning:
    """What the transformer reads besides the latents, per caption (row 0: caption_0)."""

    embeds: torch.Tensor
    pooled: torch.Tensor
    neg_embeds: torch.Tensor | None = None  # SD3's unconditional half
    neg_pooled: torch.Tensor | None = None
    text_ids: torch.Tensor | None = None  # FLUX
    image_ids: torch.Tensor | None = None


class _Renderer:
    """The family-specific steps, each through the pipeline's own components and helpers."""

    def __init__(self, pipe, kind: str, size: int, t5_tokens: int) -> None:
        self.pipe, self.kind, self.size, self.t5_tokens = pipe, kind, size, t5_tokens
        # Where the pipeline runs its models (with CPU offload, not where they are stored).
        self.device = pipe._execution_device
        self.side = size // pipe.vae_scale_factor
        if kind == "flux":
            # FluxPipeline.prepare_latents: packing needs an even latent side.
            self.side = 2 * (size // (pipe.vae_scale_factor * 2))
        self.halves = 2 if kind == "sd3" else 1
        #: FLUX.1-schnell has no guidance input: its candidates differ by seed and p only.
        self.reads_guidance = kind == "sd3" or bool(pipe.transformer.config.guidance_embeds)

    def encode(self, captions: list[str]) -> _Conditioning:
        pipe = self.pipe
        if self.kind == "sd3":
            emb, neg, pooled, neg_pooled = pipe.encode_prompt(
                prompt=captions,
                prompt_2=None,
                prompt_3=None,
                device=self.device,
                do_classifier_free_guidance=True,
                max_sequence_length=self.t5_tokens,
            )
            return _Conditioning(emb, pooled, neg, neg_pooled)
        emb, pooled, text_ids = pipe.encode_prompt(
            prompt=captions, prompt_2=None, device=self.device, max_sequence_length=self.t5_tokens
        )
        image_ids = pipe._prepare_latent_image_ids(1, self.side // 2, self.side // 2, self.device, emb.dtype)
        return _Conditioning(emb, pooled, text_ids=text_ids, image_ids=image_ids)

    def initial(self, generators: list[torch.Generator], dtype: torch.dtype) -> torch.Tensor:
        """One row per generator, drawn in float32 then cast (METHOD.md §2, Precision); FLUX
        rows packed into 2x2 patch tokens by the pipeline's own `_pack_latents`."""
        from diffusers.utils.torch_utils import randn_tensor

        cfg = self.pipe.transformer.config
        channels = cfg.in_channels // 4 if self.kind == "flux" else cfg.in_channels
        shape = (1, channels, self.side, self.side)
        rows = [randn_tensor(shape, generator=g, device=self.device, dtype=torch.float32) for g in generators]
        if self.kind == "flux":
            rows = [self.pipe._pack_latents(r, 1, channels, self.side, self.side) for r in rows]
        return torch.cat(rows).to(dtype)

    def scheduler(self, steps: int, latents: torch.Tensor):
        """A fresh FlowMatchEulerDiscreteScheduler with the pipeline's own timesteps."""
        pipe = self.pipe
        sched = type(pipe.scheduler).from_config(pipe.scheduler.config)
        if self.kind == "sd3":
            from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import (
                calculate_shift,
                retrieve_timesteps,
            )

            kwargs = {}
            if sched.config.get("use_dynamic_shifting", None):
                patch = pipe.transformer.config.patch_size
                kwargs["mu"] = calculate_shift(
                    (self.side // patch) ** 2,
                    sched.config.get("base_image_seq_len", 256),
                    sched.config.get("max_image_seq_len", 4096),
                    sched.config.get("base_shift", 0.5),
                    sched.config.get("max_shift", 1.16),
                )
            retrieve_timesteps(sched, steps, self.device, **kwargs)
            return sched
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

        sigmas = np.linspace(1.0, 1 / steps, steps)
        if getattr(sched.config, "use_flow_sigmas", False):
            sigmas = None
        mu = calculate_shift(
            latents.shape[1],
            sched.config.get("base_image_seq_len", 256),
            sched.config.get("max_image_seq_len", 4096),
            sched.config.get("base_shift", 0.5),
            sched.config.get("max_shift", 1.15),
        )
        retrieve_timesteps(sched, steps, self.device, sigmas=sigmas, mu=mu)
        return sched

    def velocity(
        self, cond: _Conditioning, x: torch.Tensor, t: torch.Tensor, caption: list[int], guidance: list[float]
    ) -> torch.Tensor:
        """The guided velocity of rows `x` (captions by index, per-row guidance)."""
        transformer = self.pipe.transformer
        if self.kind == "sd3":
            emb = torch.cat([cond.neg_embeds[caption], cond.embeds[caption]])
            pooled = torch.cat([cond.neg_pooled[caption], cond.pooled[caption]])
            xx = torch.cat([x, x])
            v_uncond, v_cond = transformer(
                hidden_states=xx,
                timestep=t.expand(xx.shape[0]),
                encoder_hidden_states=emb,
                pooled_projections=pooled,
                return_dict=False,
            )[0].chunk(2)
            g = torch.tensor(guidance, dtype=v_cond.dtype, device=self.device).view(-1, 1, 1, 1)
            # A scale <= 1 is no guidance: the conditional velocity, as StableDiffusion3Pipeline
            # runs it (`do_classifier_free_guidance = guidance_scale > 1`; SD3.5-large-turbo's
            # card: guidance 0), not the unconditional one that 0 in the formula would give.
            return torch.where(g > 1, v_uncond + g * (v_cond - v_uncond), v_cond)
        g = None
        if transformer.config.guidance_embeds:
            g = torch.tensor(guidance, dtype=torch.float32, device=self.device)
        timestep = t.expand(x.shape[0]).to(x.dtype)
        return transformer(
            hidden_states=x,
            timestep=timestep / 1000,
            guidance=g,
            pooled_projections=cond.pooled[caption],
            encoder_hidden_states=cond.embeds[caption],
            txt_ids=cond.text_ids,
            img_ids=cond.image_ids,
            return_dict=False,
        )[0]

    def decode(self, latents: torch.Tensor) -> np.ndarray:
        pipe = self.pipe
        if self.kind == "flux":
            latents = pipe._unpack_latents(latents, self.size, self.size, pipe.vae_scale_factor)
        latents = latents / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
        images = pipe.vae.decode(latents.to(pipe.vae.dtype), return_dict=False)[0]
        images = (images / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).float().cpu().numpy() * 255
        return images.round().astype(np.uint8)


def _key_specs(specs: Sequence[PairSpec], reads_guidance: bool) -> list[PairSpec]:
    # A model that ignores guidance lets candidates of one seed share rows whatever their scale.
    return list(specs) if reads_guidance else [replace(s, guidance=0.0) for s in specs]


@torch.inference_mode()
def generate_pairs_mmdit(
    pipe,
    caption_0: str,
    caption_1: str,
    specs: Sequence[PairSpec],
    *,
    steps: int,
    size: int,
    share: bool = True,
    work: UNetWork | None = None,
    early: EarlyRejection | None = None,
    vital_layers: Sequence[int] | None = None,
    reference: dict | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Images of every candidate pair, uint8 `(N, size, size, 3)` for the original and the
    edited caption, on a StableDiffusion3Pipeline or a FluxPipeline (see the module docstring);
    `vital_layers`: block indices injecting instead of the published ones (`block_names`);
    `reference`: the model's reference entry (`model_references`; None: the loaded pipeline's),
    whose T5 length the text encoder reads.
    `work` counts transformer rows (`unet_rows`, both guidance halves) and decoded images; with
    `early`, the candidates it drops are left out (their batch positions: `early.dropped`)."""
    kind = family(pipe)
    # SD3 cuts the latents into patches, FLUX packs them 2 x 2: the side must split evenly.
    multiple = pipe.vae_scale_factor * (2 if kind == "flux" else pipe.transformer.config.patch_size)
    check_image_side(size, multiple, "--image-size", f"the {kind} generator")
    r = _Renderer(pipe, kind, size, check_loaded(kind, pipe, reference)["t5_tokens"])
    cond = r.encode([caption_0, caption_1])
    specs = list(specs)
    keyed = _key_specs(specs, r.reads_guidance)
    latents = r.initial(_generators([s.seed for s in specs], 0), cond.embeds.dtype)
    sched = r.scheduler(steps, latents)
    ctrl = KVController(r.halves, cond.embeds.shape[1])
    work = work if work is not None else UNetWork()
    with vital_processors(pipe.transformer, ctrl, vital_layers or None):
        for i, t in enumerate(sched.timesteps):
            if not specs:
                break
            unique, index = _dedupe(row_keys(keyed, steps, i, share))
            at = {row: u for u, row in enumerate(unique)}
            ctrl.half = len(unique)
            ctrl.links = [
                (index[row - 1], at[row]) for row in unique if row % 2 and injected(specs[row // 2].p, i, steps)
            ]
            v = r.velocity(
                cond, latents[unique], t, [row % 2 for row in unique], [specs[row // 2].guidance for row in unique]
            )[index]
            work.unet_rows += r.halves * len(unique)
            x_t, latents = latents, sched.step(v, t, latents, return_dict=False)[0]
            if early is not None and i == early.step and i < steps - 1:
                # The x0 prediction of rectified flow (x_t = (1 - s) x0 + s noise, v = noise - x0).
                x0 = x_t[unique] - sched.sigmas[i].to(x_t.device, x_t.dtype) * v[unique]
                kept, rows = early.survivors(r.decode(x0), index, work)
                latents = latents[rows]
                specs, keyed = [specs[j] for j in kept], [keyed[j] for j in kept]
    return final_pairs(r.decode, latents, keyed, steps=steps, size=size, share=share, work=work)
