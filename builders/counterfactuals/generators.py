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

from builders.counterfactuals.model_references import Reference, default_reference
from builders.engine.errors import UserFacingError

#: Text encoders' token limits: CLIP reads 77 tokens (start and end included).
CLIP_TOKENS = 77
#: The T5 encoder's limit: the model's reference `t5_tokens` (`model_references`: SD3 256,
#: StableDiffusion3Pipeline's default; FLUX.1-dev 512, FluxPipeline's default; FLUX.1-schnell 256,
#: as Black Forest Labs' reference CLI and diffusers' FLUX docs).
T5 = "t5"


def flux_t5_tokens(pipe: Any) -> int:
    """The T5 length a loaded FLUX pipeline reads: its reference entry's (`model_references`,
    decided from its configs as every other use of the entry)."""
    from builders.counterfactuals.model_references import identify, pipeline_configs

    return identify("flux", pipeline_configs("flux", pipe)).reference.t5_tokens


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
    #: (`T5`: the model's reference T5 length).
    tokenizers: tuple[tuple[str, int | str], ...]
    #: `--image-size`'s production default (the family's native resolution).
    resolution: int
    #: `ImageStageConfig` fields passed to `render` as keywords beside the contract's.
    options: tuple[str, ...] = ()
    #: `--image-size` is a multiple of this: the VAE's scale factor (8 for every family), times
    #: the patch the transformer cuts the latents into (SD3: 2) or FLUX's 2 x 2 packing.
    size_multiple: int = 8

    @property
    def reference(self) -> Reference:
        """The default model's reference settings (`model_references`)."""
        return default_reference(self.name)

    @property
    def dtype(self) -> str:
        """What `--dtype auto` runs the default model in on CUDA (a build: its model's entry)."""
        return self.reference.dtype

    def renderer(self) -> Callable[..., Any]:
        return _resolve(self.render)

    def reference_for(self, model: str | None) -> Reference:
        """The reference settings of `model` (a Hub id, optionally `@revision`, or a folder):
        `model_references.resolve`'s decision from its configs."""
        from builders.counterfactuals.model_references import resolve

        return resolve(self.name, model or self.default_model).reference

    def method_name(self, inject: str) -> str:
        """The rows' `generation_method`: `prompt-to-prompt/cross|both` for Prompt-to-Prompt's
        word swap; `--inject self` copies the self-attention maps, the instruct-pix2pix
        generator's variant of it (Brooks et al. 2023), not a word swap."""
        if "inject" not in self.options:
            return self.method
        return f"{self.method}-instruct-pix2pix/self" if inject == "self" else f"{self.method}/{inject}"

    def token_limits(self, pipe: Any, reference: dict) -> list[tuple[Any, int]]:
        """(tokenizer, limit) of every text encoder this pipeline has (a missing one, as
        SD3 without T5, reads nothing); `reference`: the model's (`ModelReference.record`)."""
        return [
            (getattr(pipe, attr), reference["t5_tokens"] if limit == T5 else limit)
            for attr, limit in self.tokenizers
            if getattr(pipe, attr, None) is not None
        ]

    def describe_limits(self, pipe: Any, reference: dict) -> str:
        """`77 (tokenizer), 77 (tokenizer_2)`: the token limits, for a skip's detail."""
        return ", ".join(
            f"{reference['t5_tokens'] if limit == T5 else limit} ({attr})" for attr, limit in self.tokenizers
        )


_P2P = ("inject", "scheduler")
_MMDIT = ("vital_layers", "reference")
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
            (("tokenizer", CLIP_TOKENS), ("tokenizer_2", CLIP_TOKENS), ("tokenizer_3", T5)),
            1024,
            _MMDIT,
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
            (("tokenizer", CLIP_TOKENS), ("tokenizer_2", T5)),
            1024,
            _MMDIT,
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
