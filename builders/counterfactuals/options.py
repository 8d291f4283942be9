"""`counterfactory build coco-counterfactuals` options (light: `--help` imports no torch or NLTK).

The flags are the fields of `CocoCounterfactualsConfig` and its stages (`config.py`), generated
by `builders.engine.options`, plus the model roles (`builders.models.profiles`). The config
`config_from_args` makes (flags over `config.TINY` under `--models tiny`, over the fields'
defaults) is what `builders.counterfactuals.builder.from_args` (also the `accelerate launch` entry
point) builds with.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict, fields

from builders.counterfactuals.config import (
    MODEL_ROLES,
    TINY,
    CocoCounterfactualsConfig,
    ImageImportConfig,
    ImageStageConfig,
)
from builders.counterfactuals.generators import GENERATORS, GeneratorSpec, generator, generator_model
from builders.counterfactuals.model_references import ModelReference
from builders.counterfactuals.model_references import resolve as resolve_reference
from builders.counterfactuals.vital_layers_file import PUBLISHED_ON, published_elsewhere, read_vital_layers
from builders.engine.errors import UserFacingError
from builders.engine.options import Values, add_config_arguments, build_config, field_default, flag_of, given_values
from builders.models.profiles import add_model_arguments, profile_from_args, with_profile_preset

HELP = "COCO-Counterfactuals: counterfactual caption pairs + Prompt-to-Prompt image pairs"
log = logging.getLogger(__name__)

_IMPORT = 'imported image pairs (builders/counterfactuals/METHOD.md §2, "Imported image pairs")'
GROUPS = {
    "captions": "caption stage (builders/counterfactuals/METHOD.md §1)",
    "images": "image stage (builders/counterfactuals/METHOD.md §2)",
    "image_import": _IMPORT,
}
DESCRIPTIONS = {
    _IMPORT: "build from image pairs that exist (the published release's images.zip) "
    "instead of generating them: the rows keep the --captions-from ids and "
    "the images' bytes"
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(
        parser, CocoCounterfactualsConfig, group="source", groups=GROUPS, descriptions=DESCRIPTIONS, preset=TINY
    )
    add_model_arguments(parser, roles=MODEL_ROLES)
    # Resolved into the `sd` model role (the recorded model), so not a config field of its own.
    parser.add_argument(
        "--generator-model",
        default=None,
        metavar="HUB_ID_OR_PATH",
        help="the generator's model (default: "
        + ", ".join(f"{s.name} {s.default_model}" for s in GENERATORS.values())
        + "; sd15 also takes --sd-model; --models tiny: a tiny random pipeline of "
        "the generator's family)",
    )


def config_from_args(args: argparse.Namespace) -> CocoCounterfactualsConfig:
    given = given_values(CocoCounterfactualsConfig, args)
    plan = given.get("images", {}).get("candidate_plan", ImageStageConfig.candidate_plan)
    wrong = {"grouped": ["candidates"], "independent": ["seeds", "p_values"]}[plan]
    if set(given.get("images", {})) & set(wrong):
        raise UserFacingError(
            f"--{wrong[0].replace('_', '-')} does not apply to "
            f"--candidate-plan {plan} (independent: --candidates N; "
            "grouped: --seeds K --p-values M, K x M candidates)"
        )
    values = with_profile_preset(args, given, TINY)
    image_import = _image_import(values.pop("image_import", {}))
    profile = asdict(profile_from_args(args))
    images = values.setdefault("images", {})
    spec = generator(images.get("generator", ImageStageConfig.generator))
    generates = values.get("stage", "all") != "captions" and image_import is None
    models = {role: profile[role] for role in MODEL_ROLES}
    models["sd"] = _generator_model(args, spec, images, models["sd"], generates)
    # The model's own reference guidance and (production) steps, decided once from its configs
    # (`model_references`), its family's native resolution; an explicit flag wins (METHOD.md §2,
    # "Reference settings").
    reference = resolve_reference(spec.name, models["sd"]) if generates else None
    images["reference"] = reference.record() if reference else None
    _say_published_elsewhere(spec.name, images, reference)
    images.setdefault("guidance_range", (reference or spec).reference.guidance)
    if args.models == "production":
        images.setdefault("steps", (reference or spec).reference.steps)
        images.setdefault("image_size", spec.resolution)
    return build_config(
        CocoCounterfactualsConfig,
        {"stage": "images" if image_import else "all", **values, "models": models, "image_import": image_import},
    )


def _say_published_elsewhere(generator_name: str, images: dict, reference: ModelReference | None) -> None:
    """One log line where the build injects a published vital-layer list into a model other
    than the one it was measured on (FLUX's list, measured on FLUX.1-dev, into schnell)."""
    if reference is None or images.get("vital_layers") or generator_name not in PUBLISHED_ON:
        return
    elsewhere = published_elsewhere(generator_name, reference.model)
    if elsewhere:
        log.warning(
            "--generator %s injects Stable Flow's published vital layers, %s: measure this model's with "
            "`counterfactory doctor vital-layers --generator %s --generator-model MODEL` and pass --vital-layers-from",
            generator_name,
            elsewhere,
            generator_name,
        )


def _generator_model(
    args: argparse.Namespace, spec: GeneratorSpec, images: Values, profile_sd: str, generates: bool
) -> str:
    """The generator's model: `--generator-model`, else its default under the profile (sd15: the
    `sd` role, which `--sd-model` sets). Prompt-to-Prompt's own options are refused with the
    MM-DiT generators, which do not read them."""
    from builders.models.profiles import default_tiny_dir

    if spec.name != "sd15" and args.sd_model:
        raise UserFacingError(
            f"--sd-model is the sd15 generator's model: give --generator-model for --generator {spec.name}"
        )
    if args.generator_model and args.sd_model:
        raise UserFacingError("give --generator-model or --sd-model, not both")
    p2p = ImageStageConfig()
    own = ("inject", "scheduler", "cross_replace_fraction", "self_replace_fraction")
    given = [f"--{o.replace('_', '-')}" for o in own if images.get(o, getattr(p2p, o)) != getattr(p2p, o)]
    if "inject" not in spec.options and given:
        raise UserFacingError(
            f"{', '.join(given)} only apply to the Prompt-to-Prompt generators "
            f"(sd15, sdxl), not --generator {spec.name}"
        )
    vital = [flag for flag in ("vital_layers", "vital_layers_from") if images.get(flag)]
    if "vital_layers" not in spec.options and vital:
        raise UserFacingError(
            f"--{vital[0].replace('_', '-')} only applies to the MM-DiT generators (sd3, flux), not --generator {spec.name}"
        )
    if len(vital) == 2:
        raise UserFacingError("give --vital-layers or --vital-layers-from, not both")
    model = args.generator_model or (
        generator_model(spec, args.models, profile_sd, args.tiny_models_dir or default_tiny_dir())
        if generates
        else profile_sd  # nothing is generated: no generator model is loaded
    )
    if images.get("vital_layers_from"):
        # Checked against the model the build loads, before any build work starts.
        images.update(read_vital_layers(images.pop("vital_layers_from"), spec.name, model if generates else None))
    return model


def _image_import(values: Values) -> ImageImportConfig | None:
    """`--images-from` and its options; those options without it are one line."""
    if "images_from" in values:
        return build_config(ImageImportConfig, values)
    # --max-image-pixels is every image reader's bound, not an import option.
    given = [
        flag_of(f)
        for f in fields(ImageImportConfig)
        if f.name != "max_image_pixels" and values.get(f.name, field_default(f)) != field_default(f)
    ]
    if given:
        raise UserFacingError(f"{', '.join(given)} only apply to --images-from DIR_OR_ZIP")
    return None
