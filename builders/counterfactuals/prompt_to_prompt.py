"""Prompt-to-Prompt image pairs on diffusers' attention-processor API (builders/counterfactuals/METHOD.md §2).

`generate_pairs(pipe, caption_0, caption_1, specs, ...)` denoises N candidate pairs in one UNet
batch. Each pair (original image, counterfactual image) shares its initial latents and, with an
ancestral sampler, its per-step noise (two generators seeded alike), so the two images differ
only through the prompt and the attention injection. Each candidate has its own seed, injection
fraction p and guidance scale (`PairSpec`), so a candidate's images depend on its own spec only,
never on its batch position.

Which maps are injected (`inject`):
- `"self"` (default, the reference): like the instruct-pix2pix generator COCO-Counterfactuals was
  built on, the counterfactual image reuses the *self*-attention maps of the original image. It
  is done without materialising the maps: the counterfactual rows take the original rows'
  queries and keys, so `softmax(Q_o K_o^T) V_c` runs through the memory-efficient
  `scaled_dot_product_attention` (a 512x512 self-attention map would need GBs per batch).
  Injected in both the unconditional and the conditional halves of the guidance batch.
- `"cross"`: Prompt-to-Prompt's word swap (Hertz et al. 2022, `AttentionReplace`): *every*
  cross-attention map of the counterfactual comes from the original, through
  `word_swap.replacement_mapper` (P2P's `get_replacement_mapper_`): the new word's tokens take
  the replaced word's map (spread evenly when the two words have different token counts), the
  other tokens the map at their own position. Self-attention maps are replaced too, but only in the
  low-resolution layers (at most (latent side / 4)^2 query positions: 16x16 and below at 512 px),
  as the reference does. Conditional half of the guidance batch only, as the reference edits it
  (the unconditional prompt is the same for both images). Cross maps are computed explicitly at
  every step (they are small: queries x 77 tokens) so the original branch's numerics never
  depend on p.
- `"both"`: the `self` injection (every layer, both halves) and the `cross` word swap.

Injection rule (the reference's): pair j is injected at step i (0-based) while
`p_j > i / (steps - 1)`; p = 0 never injects, p = 1 injects every step but the last. The self
maps P2P replaces (low-resolution layers, conditional half) follow `PairSpec.p_self` where given
(P2P's `self_replace_steps`; default: p, the paper's); `both`'s other self maps follow p
(`P2PController.self_rows`).

Shared computation (`share=True`, builders/counterfactuals/METHOD.md §2 "Shared computation"):
the images are those of the independent computation, but the UNet sees each distinct row state
once per step. The original branch reads neither p nor the counterfactual branch, so candidates
with the same (seed, guidance) share it; their counterfactual branches are identical until the
first step where one injects and another does not (a tree of branches, forking at
`injected_steps(p)`). The sampler runs on every candidate's rows, each with its own noise
generator, so any row-wise scheduler (multistep ones included) keeps per-candidate state; only
the UNet (and the VAE decoder) work is deduplicated.

Early rejection (`early`, an approximate option, builders/counterfactuals/METHOD.md §2): after
step `early.step` the sampler's prediction of the clean latents (x0) is decoded for every
candidate and `early.check` decides which candidates go on; the others leave the batch (their
rows, noise generators and sampler history), so the remaining steps cost less. The survivors'
images are those they would have had without it: a candidate never depends on the rest of its
batch.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from builders.counterfactuals.samplers import keep_sampler_rows, make_scheduler, predicted_x0
from builders.counterfactuals.word_swap import word_swap_mapper
from builders.engine.option_types import check_image_side

INJECT_MODES = ("self", "cross", "both")


@dataclass(frozen=True)
class PairSpec:
    """One candidate pair: its seed, injection fraction and guidance scale; `p_self`: the
    fraction of the steps whose self maps are injected, where it differs from p (None: p)."""

    seed: int
    p: float
    guidance: float
    p_self: float | None = None

    @property
    def self_p(self) -> float:
        return self.p if self.p_self is None else self.p_self


@dataclass
class UNetWork:
    """Work done by `generate_pairs`: UNet rows (one latent through the UNet at one step; the
    guidance batch counts both halves) and VAE-decoded images."""

    unet_rows: int = 0
    decoded: int = 0


@dataclass
class EarlyRejection:
    """After step `step` (0-based, before the last), `check(previews_0, previews_1)` gets the
    decoded x0 predictions of the batch's live candidates (uint8 `(n, size, size, 3)` each) and
    returns one bool per candidate: keep it. `generate_pairs` lists the batch positions of the
    candidates it dropped in `dropped`."""

    step: int
    check: Callable[[np.ndarray, np.ndarray], Sequence[bool]]
    dropped: list[int] = field(default_factory=list)

    def survivors(self, previews: np.ndarray, index: Sequence[int], work: UNetWork) -> tuple[list[int], list[int]]:
        """The cut of every denoising loop (here and `mmdit_edit`): `previews`, the decoded x0
        predictions of the step's unique rows (counted in `work`), spread to every row by
        `index`; the candidates whose preview pair (rows 2j, 2j+1) passes, and their rows; the
        others go to `dropped`. One preview step, so positions among the live candidates are
        batch positions."""
        work.decoded += len(previews)
        previews = previews[index]
        keep = [bool(k) for k in self.check(previews[0::2], previews[1::2])]
        self.dropped = [j for j, k in enumerate(keep) if not k]
        kept = [j for j, k in enumerate(keep) if k]
        return kept, [2 * j + h for j in kept for h in (0, 1)]


def injected(p: float, step: int, steps: int) -> bool:
    return p > (step / (steps - 1) if steps > 1 else 0.0)


def injected_steps(p: float, steps: int) -> int:
    """How many leading steps inject (the rule is a prefix of the steps)."""
    return sum(injected(p, i, steps) for i in range(steps))


def row_keys(specs: Sequence[PairSpec], steps: int, step: int, share: bool) -> list[tuple]:
    """A key per row of `[o_1, c_1, o_2, c_2, ...]` such that rows with equal keys hold the same
    latents and get the same UNet input at `step` (`step == steps`: the final latents).

    An original row depends on (seed, guidance) only. A counterfactual row's latents before
    `step` depend on which of the steps `0..step-1` injected, a prefix of length
    `min(n, step)` with `n = injected_steps(p)`, and its UNet input on whether `step` injects
    (`n > step`): both are told by `min(n, step + 1)`, for the cross and the self maps' fractions
    (the same n unless `p_self` is given). Without `share`, every row is its own."""
    if not share:
        return [(r,) for r in range(2 * len(specs))]
    keys = []
    for s in specs:
        keys.append(("o", s.seed, s.guidance))
        keys.append(("c", s.seed, s.guidance, *(min(injected_steps(p, steps), step + 1) for p in (s.p, s.self_p))))
    return keys


def _dedupe(keys: Sequence[tuple]) -> tuple[list[int], list[int]]:
    """(first row of each distinct key, in row order; for every row, the index of its key)."""
    first: dict[tuple, int] = {}
    unique, index = [], []
    for r, key in enumerate(keys):
        if key not in first:
            first[key] = len(unique)
            unique.append(r)
        index.append(first[key])
    return unique, index


class P2PController:
    """Shared state of the processors: the current step and which pairs inject at it.

    The UNet batch is `[uncond half | cond half]`, each half `[o_1, c_1, o_2, c_2, ...]` (or, when
    `links` is set, any rows: `links` lists the (original row, counterfactual row) positions
    inside a half of `half` rows that inject cross maps at this step, `self_links` those that
    inject self maps)."""

    def __init__(
        self, specs: Sequence[PairSpec], steps: int, inject: str, mapper: torch.Tensor | None, low_res_tokens: int = 0
    ) -> None:
        if inject not in INJECT_MODES:
            raise ValueError(f"inject must be one of {INJECT_MODES}, got {inject!r}")
        self.specs, self.steps = list(specs), steps
        #: Self-attention maps of every layer, both halves (`self`, `both`; `self_rows`).
        self.inject_self = inject in ("self", "both")
        #: Word-swap cross maps, plus self maps of layers with at most `low_res_tokens` query
        #: positions, conditional half (`cross`, `both`).
        self.inject_cross = inject in ("cross", "both")
        self.mapper, self.low_res_tokens = mapper, low_res_tokens
        self.step = 0
        self.links: list[tuple[int, int]] | None = None
        self.self_links: list[tuple[int, int]] | None = None
        self.half = 2 * len(self.specs)

    def set_links(self, unique: Sequence[int], index: Sequence[int], at: dict[int, int]) -> None:
        """This step's `links`/`self_links` among the deduplicated rows `unique` (`_dedupe`'s)."""
        self.links, self.self_links = (
            [(index[r - 1], at[r]) for r in unique if r % 2 and injected(p(self.specs[r // 2]), self.step, self.steps)]
            for p in (lambda s: s.p, lambda s: s.self_p)
        )

    def self_rows(self, positions: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`rows` whose self-attention maps are injected at this step, in a layer of `positions`
        query positions. Prompt-to-Prompt's own self maps (`cross`, `both`: layers of at most
        `low_res_tokens` positions, conditional half; `AttentionControlEdit.forward`'s
        `att_replace.shape[2] <= 16 ** 2`) follow the self fraction (`self_replace_steps`); the
        `self`/`both` injection of every other self map (other layers, unconditional half) follows
        p. Without `--self-replace-fraction` the two fractions are one p."""
        p2p = self.inject_cross and positions <= self.low_res_tokens
        parts = [self.rows((1,), self_maps=True)] if p2p else []
        if self.inject_self:
            parts.append(self.rows((0,) if p2p else (0, 1)))
        parts = [r for r in parts if r is not None]
        if not parts:
            return None
        return torch.cat([src for src, _ in parts]), torch.cat([dst for _, dst in parts])

    def rows(self, halves: tuple[int, ...], self_maps: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(original rows, counterfactual rows) injecting at this step: self maps with `self_maps`, else cross."""
        links = self.self_links if self_maps else self.links
        if links is None:
            fraction = (lambda s: s.self_p) if self_maps else (lambda s: s.p)
            links = [
                (2 * j, 2 * j + 1) for j, s in enumerate(self.specs) if injected(fraction(s), self.step, self.steps)
            ]
        if not links:
            return None
        src = torch.tensor([h * self.half + o for h in halves for o, _ in links])
        dst = torch.tensor([h * self.half + c for h in halves for _, c in links])
        return src, dst


class P2PAttnProcessor:
    """Attention with Prompt-to-Prompt injection (see the module docstring)."""

    def __init__(self, controller: P2PController, is_cross: bool) -> None:
        self.ctrl, self.is_cross = controller, is_cross

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, **kwargs):
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            b, c, h, w = hidden_states.shape
            hidden_states = hidden_states.view(b, c, h * w).transpose(1, 2)
        batch, seq_len, _ = (hidden_states if encoder_hidden_states is None else encoder_hidden_states).shape
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, seq_len, batch)
            attention_mask = attention_mask.view(batch, attn.heads, -1, attention_mask.shape[-1])
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        query = attn.to_q(hidden_states)
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        if encoder_hidden_states is not None and attn.norm_cross:
            context = attn.norm_encoder_hidden_states(context)
        key, value = attn.to_k(context), attn.to_v(context)
        head_dim = key.shape[-1] // attn.heads
        query, key, value = (t.view(batch, -1, attn.heads, head_dim).transpose(1, 2) for t in (query, key, value))

        if self.is_cross and self.ctrl.inject_cross:
            out = self._cross(attn, query, key, value, attention_mask)
        else:
            rows = None if self.is_cross else self.ctrl.self_rows(query.shape[2])
            if rows is not None:
                src, dst = rows
                query, key = query.clone(), key.clone()
                query[dst], key[dst] = query[src], key[src]
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=attn.scale)
        out = out.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim).to(query.dtype)
        out = attn.to_out[1](attn.to_out[0](out))
        if input_ndim == 4:
            out = out.transpose(-1, -2).reshape(b, c, h, w)
        if attn.residual_connection:
            out = out + residual
        return out / attn.rescale_output_factor

    def _cross(self, attn, query, key, value, attention_mask):
        scores = torch.matmul(query, key.transpose(-1, -2)) * attn.scale
        if attention_mask is not None:
            scores = scores + attention_mask
        # Softmax in float32 under fp16/bf16 (a no-op in fp32), as diffusers' upcast_softmax.
        probs = scores.float().softmax(dim=-1).to(scores.dtype)
        rows = self.ctrl.rows((1,))
        if rows is not None:
            src, dst = rows
            mapper = self.ctrl.mapper.to(probs.device, probs.dtype)
            replaced = torch.einsum("bhqw,wn->bhqn", probs[src], mapper)
            own = mapper.sum(0) == 0
            replaced[..., own] = probs[dst][..., own]
            probs = probs.clone()
            probs[dst] = replaced
        return torch.matmul(probs, value)


@contextlib.contextmanager
def p2p_processors(unet, controller: P2PController) -> Iterator[None]:
    """Install P2P processors on every attention layer; restore the previous ones afterwards."""
    previous = unet.attn_processors
    unet.set_attn_processor(
        {name: P2PAttnProcessor(controller, name.endswith("attn2.processor")) for name in previous}
    )
    try:
        yield
    finally:
        unet.set_attn_processor(previous)


def _decode(pipe, latents: torch.Tensor) -> np.ndarray:
    return to_uint8(pipe.vae.decode(latents / pipe.vae.config.scaling_factor).sample)


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """The VAE's output in [-1, 1] as uint8 arrays `(n, side, side, 3)`."""
    images = (images / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).float().cpu().numpy() * 255
    return images.round().astype(np.uint8)


@dataclass
class Prompts:
    """The two captions as the UNet reads them: the conditional (`cond`) and unconditional
    (`uncond`) embeddings, row 0 the original caption and row 1 the counterfactual, and
    `added(caption)`: further UNet keywords for batch rows of these captions, both guidance
    halves (SDXL's pooled embeddings and micro-conditioning, `prompt_to_prompt_xl`)."""

    cond: torch.Tensor
    uncond: torch.Tensor
    added: Callable[[list[int]], dict] | None = None

    def unet_inputs(self, caption: list[int]) -> dict:
        inputs = {"encoder_hidden_states": torch.cat([self.uncond[caption], self.cond[caption]])}
        if self.added is not None:
            inputs["added_cond_kwargs"] = self.added(caption)
        return inputs


def _generators(seeds: Sequence[int], salt: int) -> list[torch.Generator]:
    # Two generators per pair seeded alike: both images draw identical noise. The salt keeps
    # the sampler-noise stream apart from the initial-latent stream of the same seed.
    return [torch.Generator(device="cpu").manual_seed((s + salt) % 2**63) for s in seeds for _ in (0, 1)]


@torch.inference_mode()
def generate_pairs(
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
    """Images of every candidate pair, as uint8 arrays `(N, size, size, 3)` for the original
    and the counterfactual caption. `share` evaluates each distinct row state once (same images;
    see the module docstring); `work`, when given, accumulates the work done. With `early`, the
    candidates it drops are left out of the arrays (their batch positions: `early.dropped`)."""
    device = pipe._execution_device
    cond, uncond = pipe.encode_prompt([caption_0, caption_1], device, 1, True)
    mapper = word_swap_mapper(pipe.tokenizer, caption_0, caption_1, cond.shape[1], inject)
    return denoise_pairs(
        pipe,
        Prompts(cond, uncond),
        specs,
        steps=steps,
        size=size,
        inject=inject,
        mapper=mapper,
        scheduler=scheduler,
        share=share,
        work=work,
        early=early,
        decode=_decode,
    )


def denoise_pairs(
    pipe,
    prompts: Prompts,
    specs: Sequence[PairSpec],
    *,
    steps: int,
    size: int,
    inject: str,
    mapper: torch.Tensor | None,
    scheduler: str,
    share: bool,
    work: UNetWork | None,
    early: EarlyRejection | None,
    decode: Callable[[object, torch.Tensor], np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """`generate_pairs` from the encoded captions on: the Prompt-to-Prompt denoising loop of
    any UNet pipeline (SD v1.5 here, SDXL in `prompt_to_prompt_xl`), `decode` turning latents
    into uint8 images."""
    device = pipe._execution_device
    check_image_side(size, pipe.vae_scale_factor, "--image-size", "this model's VAE")  # a custom VAE's factor
    side = size // pipe.vae_scale_factor
    # The reference's "16x16 and below" for 64x64 latents, relative to any latent size.
    ctrl = P2PController(specs, steps, inject, mapper, low_res_tokens=(side // 4) ** 2)

    sched = make_scheduler(pipe, scheduler)
    sched.set_timesteps(steps, device=device)
    seeds = [s.seed for s in specs]
    latents = _initial_latents(pipe, seeds, side, prompts.cond.dtype) * sched.init_noise_sigma
    noise_gens = _generators(seeds, 1)
    render = functools.partial(decode, pipe)
    work = work if work is not None else UNetWork()
    with p2p_processors(pipe.unet, ctrl):
        for i, t in enumerate(sched.timesteps):
            if not specs:
                break
            unique, index = _dedupe(row_keys(specs, steps, i, share))
            at = {r: u for u, r in enumerate(unique)}
            # Row 2j+1 and its original 2j: positions among the unique rows (a shared original
            # sits wherever its first candidate put it).
            ctrl.step, ctrl.half = i, len(unique)
            ctrl.set_links(unique, index, at)
            eps = _guided_noise(pipe, prompts, sched, (latents, t), (specs, unique))[index]
            out = sched.step(eps, t, latents, generator=noise_gens)
            latents = out.prev_sample
            work.unet_rows += 2 * len(unique)
            if early is not None and i == early.step and i < steps - 1:
                # Rows that shared this step's input share their x0 prediction too.
                kept, rows = early.survivors(render(predicted_x0(sched, out)[unique]), index, work)
                latents, noise_gens = latents[rows], [noise_gens[r] for r in rows]
                keep_sampler_rows(sched, rows)
                specs = ctrl.specs = [specs[j] for j in kept]
    return final_pairs(render, latents, specs, steps=steps, size=size, share=share, work=work)


def _initial_latents(pipe, seeds: Sequence[int], side: int, dtype: torch.dtype) -> torch.Tensor:
    """The 2N rows' initial latents, before the sampler's scaling: every candidate keeps its
    own rows and generators, the sampler runs on all 2N rows. The noise is drawn in float32 and
    then cast, so a seed starts from the same latents (up to rounding) in every precision
    (METHOD.md §2, Precision)."""
    from diffusers.utils.torch_utils import randn_tensor

    device = pipe._execution_device
    shape = (1, pipe.unet.config.in_channels, side, side)
    return torch.cat(
        [randn_tensor(shape, generator=g, device=device, dtype=torch.float32) for g in _generators(seeds, 0)]
    ).to(dtype)


def final_pairs(
    decode: Callable[[torch.Tensor], np.ndarray],
    latents: torch.Tensor,
    specs: Sequence[PairSpec],
    *,
    steps: int,
    size: int,
    share: bool,
    work: UNetWork,
) -> tuple[np.ndarray, np.ndarray]:
    """The end of every denoising loop (here and `mmdit_edit`): each distinct final row decoded
    once (`row_keys` of `specs` at `steps`, counted in `work`), split into the originals and the
    counterfactuals; empty arrays when no candidate is left."""
    if not specs:
        empty = np.zeros((0, size, size, 3), dtype=np.uint8)
        return empty, empty
    unique, index = _dedupe(row_keys(specs, steps, steps, share))
    images = decode(latents[unique])[index]
    work.decoded += len(unique)
    return images[0::2], images[1::2]


def _guided_noise(pipe, prompts: Prompts, sched, at: tuple, rows: tuple) -> torch.Tensor:
    """The classifier-free-guided noise prediction of the unique rows at step `at` (the latents,
    the timestep); `rows`: the specs and the unique row numbers (row 2j candidate j's original,
    2j+1 its counterfactual), each candidate at its own guidance scale."""
    (latents, t), (specs, unique) = at, rows
    caption = [r % 2 for r in unique]
    guidance = torch.tensor(
        [specs[r // 2].guidance for r in unique], dtype=prompts.cond.dtype, device=latents.device
    ).view(-1, 1, 1, 1)
    x = sched.scale_model_input(torch.cat([latents[unique], latents[unique]]), t)
    eps_uncond, eps_cond = pipe.unet(x, t, **prompts.unet_inputs(caption)).sample.chunk(2)
    return eps_uncond + guidance * (eps_cond - eps_uncond)
