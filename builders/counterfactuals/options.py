"""`counterfactory build coco-counterfactuals` options (light: `--help` imports no torch or NLTK).

The flags are the fields of `CocoCounterfactualsConfig` and its stages (`config.py`), generated
by `builders.engine.options`, plus the model roles (`builders.models.profiles`). The config
`config_from_args` makes (flags over `config.TINY` under `--models tiny`, over the fields'
defaults) is what `builders.counterfactuals.builder.from_args` (also the `accelerate launch` entry
point) builds with.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, fields

from builders.counterfactuals.config import (MODEL_ROLES, TINY, CocoCounterfactualsConfig,
                                             ImageImportConfig, ImageStageConfig)
from builders.engine.errors import UserFacingError
from builders.engine.options import (Values, add_config_arguments, build_config, field_default,
                                     flag_of, given_values)
from builders.models.profiles import add_model_arguments, profile_from_args, with_profile_preset

HELP = "COCO-Counterfactuals: counterfactual caption pairs + Prompt-to-Prompt image pairs"
_IMPORT = "imported image pairs (builders/counterfactuals/METHOD.md §2, \"Imported image pairs\")"
GROUPS = {"captions": "caption stage (builders/counterfactuals/METHOD.md §1)",
          "images": "image stage (builders/counterfactuals/METHOD.md §2)", "image_import": _IMPORT}
DESCRIPTIONS = {_IMPORT: "build from image pairs that exist (the published release's images.zip) "
                         "instead of generating them: the rows keep the --captions-from ids and "
                         "the images' bytes"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, CocoCounterfactualsConfig, group="source", groups=GROUPS,
                         descriptions=DESCRIPTIONS, preset=TINY)
    add_model_arguments(parser, roles=MODEL_ROLES)


def config_from_args(args: argparse.Namespace) -> CocoCounterfactualsConfig:
    given = given_values(CocoCounterfactualsConfig, args)
    plan = given.get("images", {}).get("candidate_plan", ImageStageConfig.candidate_plan)
    wrong = {"grouped": ["candidates"], "independent": ["seeds", "p_values"]}[plan]
    if set(given.get("images", {})) & set(wrong):
        raise UserFacingError(f"--{wrong[0].replace('_', '-')} does not apply to "
                              f"--candidate-plan {plan} (independent: --candidates N; "
                              "grouped: --seeds K --p-values M, K x M candidates)")
    values = with_profile_preset(args, given, TINY)
    image_import = _image_import(values.pop("image_import", {}))
    profile = asdict(profile_from_args(args))
    return build_config(CocoCounterfactualsConfig, {
        "stage": "images" if image_import else "all", **values,
        "models": {role: profile[role] for role in MODEL_ROLES}, "image_import": image_import})


def _image_import(values: Values) -> ImageImportConfig | None:
    """`--images-from` and its options; those options without it are one line."""
    if "images_from" in values:
        return build_config(ImageImportConfig, values)
    # --max-image-pixels is every image reader's bound, not an import option.
    given = [flag_of(f) for f in fields(ImageImportConfig) if f.name != "max_image_pixels"
             and values.get(f.name, field_default(f)) != field_default(f)]
    if given:
        raise UserFacingError(f"{', '.join(given)} only apply to --images-from DIR_OR_ZIP")
    return None
