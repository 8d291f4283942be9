"""`counterfactory build coco-counterfactuals` options (light: `--help` imports no torch or NLTK).

`config_from_args` turns them into a `CocoCounterfactualsConfig` (`builders.counterfactuals.config`),
which `builders.counterfactuals.builder.from_args` (also the `accelerate launch` entry point) builds
with.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from builders.counterfactuals.config import (CANDIDATE_PLANS, DEFAULT_COCO_SPLITS, IMAGE_FILTERS,
                                             IMAGE_LAYOUTS, MODEL_ROLES, STAGES, CaptionStageConfig,
                                             CocoCounterfactualsConfig, ImageImportConfig,
                                             ImageStageConfig)
from builders.counterfactuals.generators import GENERATOR_NAMES, GENERATORS, generator, generator_model
from builders.engine.errors import UserFacingError
from builders.engine.precision import add_dtype_argument
from builders.engine.option_types import fraction, non_negative_int, positive_int
from builders.launch import add_source_image_arguments

HELP = "COCO-Counterfactuals: counterfactual caption pairs + Prompt-to-Prompt image pairs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from builders.models.profiles import add_model_arguments

    _add_source_arguments(parser)
    _add_caption_arguments(parser)
    _add_image_arguments(parser)
    _add_import_arguments(parser)
    add_model_arguments(parser, roles=MODEL_ROLES)


def _add_source_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("source")
    src.add_argument("--stage", choices=STAGES, default=None,
                     help="what to build (default: all; images with --images-from)")
    src.add_argument("--coco-root", default=None, help="root of a COCO download")
    src.add_argument("--coco-splits", nargs="+", default=None,
                     help=f"COCO folders to read, captions in annotation-file order (default: "
                          f"{' '.join(DEFAULT_COCO_SPLITS)}, as the paper)")
    src.add_argument("--karpathy-splits", nargs="+", default=None,
                     choices=["train", "restval", "val", "test"],
                     help="read these Karpathy splits instead of --coco-splits")
    src.add_argument("--dataset", default=None, help="a `datasets` dataset (Hub id or folder)")
    src.add_argument("--dataset-config", default=None)
    src.add_argument("--dataset-split", default="train")
    src.add_argument("--text-column", default="caption")
    src.add_argument("--id-column", default=None,
                     help="row id column (default: row index; --captions-from: by format)")
    src.add_argument("--captions-from", default=None,
                     help="--stage images: the caption pairs: a captions build folder, a .tsv "
                          "(id, caption_0, caption_1) or .jsonl file (coco-counterfactual-index, "
                          "original_caption, counterfactual_caption), or a `datasets` folder or "
                          "Hub id with caption_0/caption_1 columns (METHOD.md §2)")
    src.add_argument("--captions-revision", default=None, help="--captions-from HUB_ID: branch, tag or commit")
    src.add_argument("--captions-split", default=None,
                     help="--captions-from a dataset: its split (default: its only one)")
    src.add_argument("--caption-0-column", default=None,
                     help="--captions-from a table: original caption column (default by format)")
    src.add_argument("--caption-1-column", default=None,
                     help="--captions-from a table: counterfactual caption column (default by format)")
    src.add_argument("--allow-multiword-edits", action="store_true",
                     help="--captions-from a table: also draw pairs whose captions differ in more "
                          "than one word (counted and skipped otherwise)")
    src.add_argument("--max-captions", type=positive_int, default=None, help="first N source captions")
    src.add_argument("--output-split", default="test", help="split name of the output (default test)")
    src.add_argument("--seed", type=int, default=0)
    src.add_argument("--device", default=None, help="torch device (default: own GPU, else CPU)")
    add_dtype_argument(src, "the image stage's Stable Diffusion and CLIP filter (the caption "
                            "stage's text models run in fp32)")
    src.add_argument("--torch-threads", type=positive_int, default=None,
                     help="intra-op CPU threads per process; give the same value to runs whose "
                          "shards must be bit-identical (accelerate workers default to 1)")


def _add_caption_arguments(parser: argparse.ArgumentParser) -> None:
    cap, d = parser.add_argument_group("caption stage (builders/counterfactuals/METHOD.md §1)"), CaptionStageConfig()
    cap.add_argument("--top-k", type=positive_int, default=d.top_k, help="MLM proposals per noun")
    cap.add_argument("--sim-low", type=float, default=d.sim_low, help="similarity > this")
    cap.add_argument("--sim-high", type=float, default=d.sim_high, help="similarity <= this")
    cap.add_argument("--min-words", type=non_negative_int, default=d.min_words)
    cap.add_argument("--no-english-check", action="store_true", help="keep non-English captions")
    cap.add_argument("--avoid-related-nouns", action="store_true",
                     help="drop hyponym/hypernym/synonym swaps (needs NLTK wordnet data)")
    cap.add_argument("--caption-batch", type=positive_int, default=d.caption_batch,
                     help="captions per MLM batch")
    cap.add_argument("--caption-order", choices=("auto", "similarity_first", "perplexity_first"),
                     default=d.order, help="scoring order (same choice; auto: by model sizes)")


def _add_image_arguments(parser: argparse.ArgumentParser) -> None:
    from builders.models.profiles import add_profile_argument

    img, e = parser.add_argument_group("image stage (builders/counterfactuals/METHOD.md §2)"), ImageStageConfig()
    img.add_argument("--generator", choices=GENERATOR_NAMES, default=e.generator,
                     help="which model draws the image pairs: sd15 (default, the paper's "
                          "Prompt-to-Prompt on SD v1.5), sdxl (Prompt-to-Prompt on SDXL base), "
                          "sd3, flux (Stable Flow vital-layer injection on MM-DiT; METHOD.md §2, Generators)")
    img.add_argument("--generator-model", default=None, metavar="HUB_ID_OR_PATH",
                     help="the generator's model (default: " + ", ".join(
                         f"{s.name} {s.default_model}" for s in GENERATORS.values())
                     + "; sd15 also takes --sd-model; --models tiny: a tiny random pipeline of the "
                       "generator's family)")
    img.add_argument("--cpu-offload", action="store_true",
                     help="keep the generator's weights in CPU memory and move each model to the "
                          "GPU only while it runs (diffusers' enable_model_cpu_offload): for GPUs "
                          "that cannot hold the pipeline (FLUX.1 in bf16); same images, slower")
    add_profile_argument(img, "--candidates", type=positive_int, default=e.candidates, tiny=4,
                         help="independent plan: candidate pairs per caption pair (paper: 100)")
    img.add_argument("--candidate-plan", choices=CANDIDATE_PLANS, default=e.candidate_plan,
                     help="independent (default, the paper's sampling): a seed, p and guidance "
                          "per candidate; grouped: --seeds groups sharing seed and guidance, "
                          "--p-values p each, whose UNet work is shared (METHOD.md §2)")
    add_profile_argument(img, "--seeds", type=positive_int, default=e.seeds, tiny=2,
                         help="grouped plan: groups (seed, guidance) per caption pair")
    add_profile_argument(img, "--p-values", type=positive_int, default=e.p_values, tiny=3,
                         help="grouped plan: injection fractions per group")
    img.add_argument("--candidate-batch", type=positive_int, default=e.candidate_batch,
                     help="candidate pairs per UNet batch (rounded to whole groups)")
    img.add_argument("--no-shared-computation", action="store_true",
                     help="evaluate every candidate's UNet rows even where candidates share them "
                          "(same images, more work: to measure or check the saving)")
    add_profile_argument(img, "--steps", type=positive_int, default=e.steps, tiny=2, help="denoising steps")
    add_profile_argument(img, "--image-size", type=positive_int, default=e.image_size, tiny=64,
                         help="image side in pixels")
    img.add_argument("--p-range", type=fraction, nargs=2, default=list(e.p_range), metavar=("LO", "HI"))
    img.add_argument("--guidance-range", type=float, nargs=2, default=list(e.guidance_range),
                     metavar=("LO", "HI"))
    img.add_argument("--filters", nargs="+", choices=IMAGE_FILTERS, default=list(e.filters),
                     help="candidate filters to apply (default: all three, as the paper; "
                          "`--filters text_image` is the looser caption-image check alone)")
    # Random tiny CLIP scores sit near 0: with the paper's thresholds no candidate would pass.
    add_profile_argument(img, "--clip-threshold", type=float, default=e.clip_threshold, tiny=-1.0,
                         help="text_image filter: minimum caption-image CLIP cosine of both images")
    add_profile_argument(img, "--image-similarity-threshold", type=float,
                         default=e.image_similarity_threshold, tiny=-1.0,
                         help="image_image filter: minimum CLIP cosine of the two images")
    add_profile_argument(img, "--directional-threshold", type=float,
                         default=e.directional_threshold, tiny=-1.0,
                         help="directional filter: minimum CLIP directional similarity")
    img.add_argument("--early-stop", type=positive_int, default=None, help="stop once K candidates pass")
    img.add_argument("--early-reject-at", type=float, default=None, metavar="FRACTION",
                     help="approximate, off by default: after this fraction of the steps, score "
                          "each candidate's predicted clean image with CLIP and stop denoising "
                          "those that fail a filter by more than --early-reject-margin (METHOD.md §2)")
    img.add_argument("--early-reject-margin", type=float, default=e.early_reject_margin,
                     help="early rejection: how far below a filter's threshold a preview must "
                          f"score to be dropped (default {e.early_reject_margin})")
    img.add_argument("--inject", choices=("self", "cross", "both"), default=e.inject,
                     help="maps injected for the first fraction p of steps: self (default, as the "
                          "paper's generator): every self-attention map; cross: Prompt-to-Prompt's "
                          "word swap (the new word takes the old word's cross-attention map, "
                          "self maps in low-resolution layers); both (METHOD.md §2)")
    img.add_argument("--scheduler", choices=("euler_ancestral", "dpm_solver_pp", "pipeline"),
                     default=e.scheduler,
                     help="euler_ancestral (default, as the paper's generator); dpm_solver_pp: "
                          "DPM-Solver++ for fewer steps (e.g. --steps 25; other images, METHOD.md "
                          "§2); pipeline: the model's own scheduler")


def _add_import_arguments(parser: argparse.ArgumentParser) -> None:
    imp = parser.add_argument_group(
        "imported image pairs (builders/counterfactuals/METHOD.md §2, \"Imported image pairs\")",
        "build from image pairs that exist (the published release's images.zip) instead of "
        "generating them: the rows keep the --captions-from ids and the images' bytes")
    imp.add_argument("--images-from", default=None, metavar="DIR_OR_ZIP",
                     help="a folder or a .zip (read in place) holding each row's two images")
    imp.add_argument("--images-layout", choices=IMAGE_LAYOUTS, default="auto",
                     help="how the images are named: folders (synthetic-images-for-original-"
                          "captions/{id}.jpg and synthetic-images-for-counterfactual-captions/"
                          "{id}.jpg, the paper's evaluation code), numbered ({id}_0.jpg, {id}_1.jpg), "
                          "release ({id}_img_0.jpg, {id}_img_1.jpg, the Hub release's images.zip); "
                          "default auto: detected, at the top or under one top-level folder")
    imp.add_argument("--images-pattern", nargs="+", default=None, metavar="PATTERN",
                     help="names relative to the folder or zip root instead of a layout: one "
                          "pattern with {id} and {n} (0 original, 1 counterfactual), e.g. "
                          "'pairs/{id}-{n}.png', or two patterns with {id}, one per image")
    imp.add_argument("--no-clip-scores", action="store_true",
                     help="import without scoring the pairs with the CLIP filter (no model runs; "
                          "the score columns are null): minutes instead of hours on a CPU")
    imp.add_argument("--apply-filters", action="store_true",
                     help="drop imported pairs failing --filters at their thresholds (default: "
                          "the CLIP scores are recorded, every pair is kept)")
    add_source_image_arguments(parser)


def config_from_args(args: argparse.Namespace) -> CocoCounterfactualsConfig:
    from builders.models.profiles import profile_from_args

    profile = asdict(profile_from_args(args))
    given = getattr(args, "given_options", set())
    wrong = {"grouped": ["candidates"], "independent": ["seeds", "p_values"]}[args.candidate_plan]
    if given & set(wrong):
        raise UserFacingError(f"--{wrong[0].replace('_', '-')} does not apply to "
                              f"--candidate-plan {args.candidate_plan} (independent: --candidates N; "
                              "grouped: --seeds K --p-values M, K x M candidates)")
    captions = CaptionStageConfig(
        top_k=args.top_k, sim_low=args.sim_low, sim_high=args.sim_high, min_words=args.min_words,
        english_check=not args.no_english_check, avoid_related_nouns=args.avoid_related_nouns,
        caption_batch=args.caption_batch, order=args.caption_order)
    spec = generator(args.generator)
    # Under production the generator's own defaults (its native resolution); tiny: one for all.
    own = args.models == "production"
    steps = spec.steps if own and "steps" not in given else args.steps
    image_size = spec.resolution if own and "image_size" not in given else args.image_size
    images = ImageStageConfig(
        generator=args.generator, candidates=args.candidates,
        candidate_plan=args.candidate_plan, seeds=args.seeds, p_values=args.p_values, candidate_batch=args.candidate_batch,
        share=not args.no_shared_computation, steps=steps,
        image_size=image_size, p_range=tuple(args.p_range),
        guidance_range=tuple(args.guidance_range), filters=tuple(args.filters),
        clip_threshold=args.clip_threshold, directional_threshold=args.directional_threshold,
        image_similarity_threshold=args.image_similarity_threshold, early_stop=args.early_stop,
        early_reject_at=args.early_reject_at, early_reject_margin=args.early_reject_margin,
        inject=args.inject, scheduler=args.scheduler)
    image_import = _image_import(args)
    return CocoCounterfactualsConfig(
        stage=args.stage or ("images" if image_import else "all"),
        coco_root=str(args.coco_root) if args.coco_root else None,
        karpathy_splits=tuple(args.karpathy_splits) if args.karpathy_splits else None,
        coco_splits=tuple(args.coco_splits) if args.coco_splits else None,
        dataset=args.dataset, dataset_config=args.dataset_config, dataset_split=args.dataset_split,
        text_column=args.text_column, id_column=args.id_column,
        captions_from=str(args.captions_from) if args.captions_from else None,
        captions_revision=args.captions_revision, captions_split=args.captions_split,
        caption_0_column=args.caption_0_column, caption_1_column=args.caption_1_column,
        allow_multiword_edits=args.allow_multiword_edits,
        max_captions=args.max_captions, split=args.output_split, seed=args.seed,
        models={role: profile[role] for role in MODEL_ROLES} | {"sd": _generator_model(args, profile)},
        captions=captions, images=images, image_import=image_import)


def _generator_model(args: argparse.Namespace, profile: dict[str, str]) -> str:
    """The generator's model: `--generator-model`, else its default under the profile (sd15:
    the `sd` role, which `--sd-model` sets). Prompt-to-Prompt's own options are refused with the
    MM-DiT generators, which do not read them."""
    from builders.models.profiles import default_tiny_dir

    spec = generator(args.generator)
    if spec.name != "sd15" and args.sd_model:
        raise UserFacingError(f"--sd-model is the sd15 generator's model: give --generator-model "
                              f"for --generator {spec.name}")
    if args.generator_model and args.sd_model:
        raise UserFacingError("give --generator-model or --sd-model, not both")
    p2p = ImageStageConfig()
    given = [f"--{o}" for o in ("inject", "scheduler") if getattr(args, o) != getattr(p2p, o)]
    if "inject" not in spec.options and given:
        raise UserFacingError(f"{', '.join(given)} only apply to the Prompt-to-Prompt generators "
                              f"(sd15, sdxl), not --generator {spec.name}")
    if args.generator_model:
        return args.generator_model
    if (args.stage or ("images" if args.images_from else "all")) == "captions" or args.images_from:
        return profile["sd"]  # nothing is generated: no generator model is loaded
    return generator_model(spec, args.models, profile["sd"],
                           args.tiny_models_dir or default_tiny_dir())


def _image_import(args: argparse.Namespace) -> ImageImportConfig | None:
    """`--images-from` and its options; those options without it are one line."""
    if args.images_from:
        return ImageImportConfig(images_from=str(args.images_from), layout=args.images_layout,
                                 pattern=tuple(args.images_pattern or ()),
                                 clip_scores=not args.no_clip_scores,
                                 apply_filters=args.apply_filters,
                                 max_image_pixels=args.max_image_pixels)
    given = [flag for flag, on in (("--images-layout", args.images_layout != "auto"),
                                   ("--images-pattern", args.images_pattern),
                                   ("--no-clip-scores", args.no_clip_scores),
                                   ("--apply-filters", args.apply_filters)) if on]
    if given:
        raise UserFacingError(f"{', '.join(given)} only apply to --images-from DIR_OR_ZIP")
    return None
