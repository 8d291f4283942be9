"""The image stage's generators (`--generator`; builders/counterfactuals/METHOD.md §2, "Generators").

`GENERATORS` maps a name to a `GeneratorSpec`: the pipeline it loads, how it draws an edited
twin (`method`), its default Hub model and that model's license (the card states it), its
renderer, its tiny pipeline, and the text encoders whose token limits decide which edits it can
see (`unseen_edit`). Every renderer keeps the contract of `prompt_to_prompt.generate_pairs`:
`render(pipe, caption_0, caption_1, specs, *, steps, size, share, work, early)` -> uint8 arrays
`(N, size, size, 3)` per caption, a candidate's images depending only on its own `PairSpec`,
plus the `ImageStageConfig` fields named by `options`.

Renderers and tiny builders are named by `module:function` and imported when used: `--help`
imports no torch, and a generator's module loads only when that generator runs.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from builders.engine.errors import UserFacingError

#: Text encoders' token limits: CLIP reads 77 tokens (start and end included).
CLIP_TOKENS = 77
#: T5 tokens the MM-DiT renderer reads (`max_sequence_length`): SD3 256, StableDiffusion3Pipeline's
#: default; FLUX.1-dev 512, FluxPipeline's default, but FLUX.1-schnell 256, as Black Forest Labs'
#: reference CLI (`max_length=256` for schnell) and diffusers' FLUX docs (at most 256 for schnell).
#: A FLUX transformer without a guidance embedding is schnell-like (`flux_t5_tokens`).
SD3_T5_TOKENS, FLUX_DEV_T5_TOKENS, FLUX_SCHNELL_T5_TOKENS = 256, 512, 256


def flux_t5_tokens(pipe: Any) -> int:
    """The T5 length a FLUX pipeline reads: FLUX.1-dev's 512 with a guidance embedding, else
    FLUX.1-schnell's 256 (module constants)."""
    dev = bool(pipe.transformer.config.guidance_embeds)
    return FLUX_DEV_T5_TOKENS if dev else FLUX_SCHNELL_T5_TOKENS


@dataclass(frozen=True)
class Reference:
    """A model's reference sampling settings: default `--steps` and `--guidance-range` (a fixed
    scale is a range of one value; 0: the model reads no guidance), and where they come from
    (builders/counterfactuals/METHOD.md §2, "Reference settings")."""

    steps: int
    guidance: tuple[float, float]
    source: str


@dataclass(frozen=True)
class GeneratorSpec:
    name: str
    #: How the twin image is drawn (the rows' `generation_method`; P2P adds the `--inject` mode).
    method: str
    #: `builders.models.loaders.load_generator`'s pipeline kind.
    pipeline: str
    #: Hub id of the production model, and its license.
    default_model: str
    license: str
    #: `module:function` rendering candidate pairs (module docstring).
    render: str
    #: `module:function(out_dir)` saving the tiny random-init pipeline (None: the tiny
    #: profile's `sd` model).
    tiny: str | None
    #: `(pipeline attribute, token limit)` of each tokenizer the pipeline's text encoders read
    #: (a limit that depends on the model: a function of the pipeline).
    tokenizers: tuple[tuple[str, int | Callable[[Any], int]], ...]
    #: The default model's reference settings, and those of other known models of the family
    #: (by Hub id); `--image-size`'s production default (the family's native resolution).
    reference: Reference
    resolution: int
    #: `ImageStageConfig` fields passed to `render` as keywords beside the contract's.
    options: tuple[str, ...] = ()
    known_models: tuple[tuple[str, Reference], ...] = ()
    #: What `--dtype auto` runs the model in on CUDA (`precision.resolve_dtype`): fp16, or bf16
    #: for FLUX.1, whose reference dtype it is (in fp16 it overflowed to NaN images until
    #: diffusers clamped its activations, diffusers issue #9096).
    dtype: str = "fp16"
    #: `--image-size` is a multiple of this: the VAE's scale factor (8 for every family), times
    #: the patch the transformer cuts the latents into (SD3: 2) or FLUX's 2 x 2 packing.
    size_multiple: int = 8

    def renderer(self) -> Callable[..., Any]:
        return _resolve(self.render)

    def reference_for(self, model: str | None) -> Reference:
        """The reference settings of `model` (a Hub id, optionally `@revision`): its own where
        the family knows it, else the default model's."""
        known = dict(self.known_models)
        return known.get((model or "").split("@")[0], self.reference)

    def method_name(self, inject: str) -> str:
        """The rows' `generation_method`: `prompt-to-prompt/cross|both` for Prompt-to-Prompt's
        word swap; `--inject self` copies the self-attention maps, the instruct-pix2pix
        generator's variant of it (Brooks et al. 2023), not a word swap."""
        if "inject" not in self.options:
            return self.method
        return f"{self.method}-instruct-pix2pix/self" if inject == "self" else f"{self.method}/{inject}"

    def token_limits(self, pipe: Any) -> list[tuple[Any, int]]:
        """(tokenizer, limit) of every text encoder this pipeline has (a missing one, as
        SD3 without T5, reads nothing)."""
        return [
            (getattr(pipe, attr), limit(pipe) if callable(limit) else limit)
            for attr, limit in self.tokenizers
            if getattr(pipe, attr, None) is not None
        ]

    def describe_limits(self, pipe: Any) -> str:
        """`77 (tokenizer), 77 (tokenizer_2)`: the token limits, for a skip's detail."""
        return ", ".join(f"{limit(pipe) if callable(limit) else limit} ({attr})" for attr, limit in self.tokenizers)


#: Reference settings (builders/counterfactuals/METHOD.md §2, "Reference settings"). SD v1.5: the
#: paper's 100 steps and guidance ~ U(7.5, 15) (Le et al. 2023 App. B.1.2, after instruct-pix2pix).
#: The others: the scale and steps of diffusers' pipeline defaults, which are the models' cards'.
SD15_REFERENCE = Reference(100, (7.5, 15.0), "Le et al. 2023, App. B.1.2 (instruct-pix2pix's range)")
SDXL_REFERENCE = Reference(50, (5.0, 5.0), "diffusers StableDiffusionXLPipeline defaults")
SD3_REFERENCE = Reference(28, (7.0, 7.0), "SD3-medium model card; diffusers StableDiffusion3Pipeline defaults")
FLUX_SCHNELL_REFERENCE = Reference(4, (0.0, 0.0), "FLUX.1-schnell model card: 4 steps, guidance 0 (none read)")
FLUX_DEV_REFERENCE = Reference(28, (3.5, 3.5), "diffusers FluxPipeline defaults; Stable Flow's guidance 3.5")
_P2P = ("inject", "scheduler")
_MMDIT = ("vital_layers",)
GENERATORS = {
    spec.name: spec
    for spec in (
        GeneratorSpec(
            "sd15",
            "prompt-to-prompt",
            "sd",
            "stable-diffusion-v1-5/stable-diffusion-v1-5",
            "CreativeML Open RAIL-M",
            "builders.counterfactuals.prompt_to_prompt:generate_pairs",
            None,
            (("tokenizer", CLIP_TOKENS),),
            SD15_REFERENCE,
            512,
            _P2P,
        ),
        GeneratorSpec(
            "sdxl",
            "prompt-to-prompt",
            "sdxl",
            "stabilityai/stable-diffusion-xl-base-1.0",
            "CreativeML Open RAIL++-M",
            "builders.counterfactuals.prompt_to_prompt_xl:generate_pairs_xl",
            "builders.models.tiny_sdxl:build_tiny_sdxl",
            (("tokenizer", CLIP_TOKENS), ("tokenizer_2", CLIP_TOKENS)),
            SDXL_REFERENCE,
            1024,
            _P2P,
        ),
        GeneratorSpec(
            "sd3",
            "stable-flow-vital-layers",
            "sd3",
            "stabilityai/stable-diffusion-3-medium-diffusers",
            "Stability AI Community License",
            "builders.counterfactuals.mmdit_edit:generate_pairs_mmdit",
            "builders.models.tiny_mmdit:build_tiny_sd3",
            (("tokenizer", CLIP_TOKENS), ("tokenizer_2", CLIP_TOKENS), ("tokenizer_3", SD3_T5_TOKENS)),
            SD3_REFERENCE,
            1024,
            _MMDIT,
            known_models=(
                ("stabilityai/stable-diffusion-3.5-medium", Reference(40, (4.5, 4.5), "SD3.5-medium model card")),
                ("stabilityai/stable-diffusion-3.5-large", Reference(28, (3.5, 3.5), "SD3.5-large model card")),
            ),
            size_multiple=16,
        ),
        GeneratorSpec(
            "flux",
            "stable-flow-vital-layers",
            "flux",
            "black-forest-labs/FLUX.1-schnell",
            "Apache-2.0",
            "builders.counterfactuals.mmdit_edit:generate_pairs_mmdit",
            "builders.models.tiny_mmdit:build_tiny_flux",
            (("tokenizer", CLIP_TOKENS), ("tokenizer_2", flux_t5_tokens)),
            FLUX_SCHNELL_REFERENCE,
            1024,
            _MMDIT,
            known_models=(("black-forest-labs/FLUX.1-dev", FLUX_DEV_REFERENCE),),
            dtype="bf16",
            size_multiple=16,
        ),
    )
}
GENERATOR_NAMES = tuple(GENERATORS)


def generator(name: str) -> GeneratorSpec:
    if name not in GENERATORS:
        raise UserFacingError(f"--generator takes {', '.join(GENERATOR_NAMES)} (got {name!r})")
    return GENERATORS[name]


def _resolve(target: str) -> Callable[..., Any]:
    module, _, name = target.partition(":")
    if importlib.util.find_spec(module) is None:
        raise UserFacingError(
            f"this installation lacks {module} ({name}): update counterfactory or choose another --generator"
        )
    return getattr(importlib.import_module(module), name)


def generator_model(spec: GeneratorSpec, profile: str, profile_sd: str, tiny_dir: Path) -> str:
    """The model a build of `spec` loads when `--generator-model` is not given: the production
    Hub id, or under `--models tiny` its tiny pipeline (built once under `tiny_dir`); sd15 keeps
    the profile's `sd` model (`--sd-model`)."""
    if spec.tiny is None:
        return profile_sd
    if profile != "tiny":
        return spec.default_model
    from builders.models.tiny import build_once

    build = _resolve(spec.tiny)
    return str(build_once(tiny_dir / "generators" / spec.name, build))
