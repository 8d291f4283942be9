"""`counterfactory doctor`: one item through every stage at the production sizes, with random
weights (no download), and per stage its time, memory and the fp16 batch size that fits a
24 / 40 / 80 GB GPU (builders/devtools/doctor.py); then a row per image-stage generator
(builders/devtools/doctor_generators.py). `counterfactory doctor vital-layers` measures an MM-DiT's
vital layers (builders/devtools/vital_layers.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from builders.devtools.doctor_generators import GENERATORS
from builders.devtools.doctor_stages import STAGE_NAMES
from builders.devtools.vital_layers import (
    DEFAULT_DINO,
    DEFAULT_PROMPTS,
    MEASURED_MODEL,
    SAMPLE_SIZE,
    TINY_SAMPLES,
    TINY_STEPS,
)
from builders.engine.option_types import positive_int, seed_int, steps_int
from builders.engine.precision import add_dtype_argument


def _stages(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _generators(text: str) -> tuple[str, ...]:
    return () if text.strip() == "none" else _stages(text)


def _doctor(args: argparse.Namespace) -> int:
    from builders.devtools.doctor import (
        HEADER,
        DoctorConfig,
        check_json_path,
        footer,
        format_row,
        run_doctor,
        write_json,
    )
    from builders.devtools.doctor_generators import (
        GENERATOR_HEADER,
        check_generators,
        format_generator_row,
        run_generators,
    )
    from builders.engine.distributed import worker_device

    if args.json:
        check_json_path(args.json)
    check_generators(args.generators)
    config = DoctorConfig(
        stages=args.stages,
        resolution=args.resolution,
        steps=args.steps,
        size=args.models,
        tiny_dir=args.tiny_models_dir,
        generators=args.generators,
    )
    device = worker_device()
    rows = []
    if config.stages:
        # Each row as soon as its stage is measured: a CPU run of the real sizes takes minutes.
        print(HEADER, "-" * len(HEADER), sep="\n", flush=True)
        rows = run_doctor(config, on_row=lambda row: print(format_row(row), flush=True))
        print(footer(config, device))
    generators = []
    if config.generators:
        print("", GENERATOR_HEADER, "-" * len(GENERATOR_HEADER), sep="\n", flush=True)
        generators = run_generators(
            config.generators,
            production=config.size == "production",
            resolution=config.resolution,
            device=device,
            on_row=lambda row: print(format_generator_row(row), flush=True),
        )
        print(
            "image-stage generators: candidate pairs per batch at each model's resolution "
            "(fp16; FLUX bf16); --cpu-offload keeps one component on the GPU at a time; "
            "10% of the GPU left free"
        )
    if args.json:
        write_json(args.json, rows, config, device, generators)
        print(f"table written to {args.json}")
    return 0


def _vital_layers(args: argparse.Namespace) -> int:
    from builders.counterfactuals.generators import generator
    from builders.devtools.vital_layers import VitalLayersConfig, check_output, measure, report, write_result
    from builders.engine.precision import worker_precision

    output = args.output or Path(f"vital-layers-{args.generator}.json")
    check_output(output)
    precision = worker_precision(args.dtype, None, generator(args.generator).dtype)
    tiny = args.models == "tiny"
    config = VitalLayersConfig(
        args.generator,
        model=args.generator_model,
        prompts=tuple(args.prompts or DEFAULT_PROMPTS),
        samples=args.samples,
        seed=args.seed,
        steps=args.steps,
        size=args.image_size or (64 if tiny else 1024),
        top=args.top,
        dino_model=args.dino_model,
        tiny=tiny,
        device=precision.device,
        dtype=precision.dtype,
    )
    result = measure(config, args.tiny_models_dir)
    print(report(result))
    write_result(output, args.generator, result)
    if result.vital_layers:
        print(f"written to {output}: build with --generator {args.generator} --vital-layers-from {output}")
    else:  # a build refuses an empty list: say so here rather than at the build
        print(f"written to {output}, with no vital layers: a build cannot take it (measure with --top N to list N)")
    return 0


def _register_vital_layers(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "vital-layers",
        help="measure an MM-DiT's vital layers as Stable Flow does (sd3, flux)",
        description="Bypass each transformer block in turn on K prompt x seed samples, score how "
        "much the image changes against the full model's with DINOv2 image similarity, rank the "
        "blocks and read the vital set off the ranking: the blocks before its knee (Kneedle, "
        "Satopaa et al. 2011), as Stable Flow reads its set off the ranking (Avrahami et al. CVPR "
        "2025, §3.1; builders/counterfactuals/METHOD.md §6). Prints every block's score and the list "
        "--vital-layers takes, and writes it as JSON with the model's identity (id, revision, "
        "config hash, blocks) for `counterfactory build coco-counterfactuals --vital-layers-from`, "
        "which refuses it for another model. Needs the real weights and a GPU for a meaningful "
        "list ((blocks + 1) x K pipeline runs); --models tiny checks that it runs.",
    )
    p.add_argument("--generator", choices=tuple(MEASURED_MODEL), required=True)
    p.add_argument(
        "--generator-model",
        default=None,
        metavar="HUB_ID_OR_PATH",
        help="the model to measure (default: the one the published list comes from, "
        + ", ".join(f"{g} {m}" for g, m in MEASURED_MODEL.items())
        + ")",
    )
    p.add_argument(
        "--prompts", nargs="+", default=None, help="prompts, cycled over the samples (default: 4 COCO-like scenes)"
    )
    p.add_argument(
        "--samples",
        type=positive_int,
        default=None,
        metavar="K",
        help=f"prompt x seed samples (default {SAMPLE_SIZE}, Stable Flow's K; tiny: {TINY_SAMPLES}); "
        "sample i draws prompt i mod P with seed --seed + i",
    )
    p.add_argument("--seed", type=seed_int, default=0, help="the first sample's seed (default 0)")
    p.add_argument(
        "--steps",
        type=steps_int,
        default=None,
        help=f"default: the model's reference steps (tiny: {TINY_STEPS}, a check that runs within a minute)",
    )
    p.add_argument("--image-size", type=positive_int, default=None, help="default: 1024 (tiny: 64)")
    p.add_argument(
        "--top",
        type=positive_int,
        default=None,
        help="list the N most vital blocks instead of reading the set off the ranking's knee "
        "(at most the model's block count)",
    )
    p.add_argument("--dino-model", default=DEFAULT_DINO, help="DINOv2 model scoring similarity (default %(default)s)")
    p.add_argument("--models", choices=("production", "tiny"), default="production")
    p.add_argument("--tiny-models-dir", type=Path, default=None)
    add_dtype_argument(p, "the generator and DINOv2")
    p.add_argument("--output", type=Path, default=None, help="JSON to write (default vital-layers-GENERATOR.json)")
    p.set_defaults(func=_vital_layers)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "doctor",
        help="run one item through every stage at the production model sizes: time, "
        "memory and the batch that fits a 24/40/80 GB GPU",
        description="Instantiate every production architecture (SD v1.5 and its inpainting UNet, "
        "CLIP ViT-L/14 and ViT-B/32, roberta-base, gpt2-large, and the cross-encoders the report "
        "scores: BLIP ITM base and large, BridgeTower large ITM and ITC, ViLT, FLAVA ITM and contrastive) with random weights "
        "at its real size, run one item through each stage on this process's device (its GPU under CUDA, "
        "else the CPU) and print per stage the time, the peak memory and the batch size that "
        "fits a 24/40/80 GB GPU in fp16, extrapolated from the measured fp32 memory. Needs "
        "about 5 GB of free memory at a time (the SD UNet, gpt2-large and BridgeTower large are 3 to 3.5 GB each) and no "
        "network: tokenizers come from the tiny profile (`counterfactory models tiny`). Then a "
        "row per image-stage generator (sd15, sdxl, sd3, flux): its weights per dtype, the "
        "activations of one candidate pair and the pairs that fit a 24/40/80 GB GPU, with and "
        "without --cpu-offload; a model too large for this machine (SDXL, SD3 and FLUX on a "
        "24 GB one) is computed on the meta device instead, which its row says.",
    )
    p.add_argument(
        "--stages",
        type=_stages,
        default=STAGE_NAMES,
        metavar="A,B",
        help=f"comma-separated stages to run (default all: {','.join(STAGE_NAMES)})",
    )
    p.add_argument(
        "--resolution",
        type=int,
        default=512,
        help="image side for the diffusion stages (default 512, the production one; "
        "smaller is faster on a CPU, and the memory is extrapolated to 512)",
    )
    p.add_argument("--steps", type=steps_int, default=2, help="denoising steps (default 2)")
    p.add_argument(
        "--models",
        choices=("production", "tiny"),
        default="production",
        help="production architectures (default) or the tiny profile's (a quick check)",
    )
    p.add_argument(
        "--tiny-models-dir",
        type=Path,
        default=None,
        help="where the tiny profile (tokenizers, schedulers) is built/cached",
    )
    p.add_argument(
        "--generators",
        type=_generators,
        default=GENERATORS,
        metavar="A,B",
        help="image-stage generators to give a row (weights per dtype, activations per "
        "candidate pair at 512 px for sd15 and 1024 px for the others, pairs that fit "
        "24/40/80 GB with and without --cpu-offload): measured where the model fits "
        "this machine, meta-device arithmetic otherwise (default all: "
        f"{','.join(GENERATORS)}; `none` for no rows)",
    )
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the table as JSON")
    p.set_defaults(func=_doctor)
    _register_vital_layers(p.add_subparsers(dest="doctor_check", metavar="CHECK"))
