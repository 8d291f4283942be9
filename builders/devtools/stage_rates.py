"""The stage costs behind the production table's GPU-days (`benchmarks/gpu_check.py`, #52 item 5),
measured per image-stage generator through the code a build runs.

Each generator's pipeline runs its own render function (`GENERATORS[name].render`, the build's
default options: `--inject self` for P2P, the published vital layers for the MMDiT edit) on a
batch of `candidate_batch` candidate pairs without shared computation, with timers around the
text encoders, the denoiser and the VAE decoder (the device synchronised around each call):

- text encoding: seconds of one render call's encoder forwards;
- VAE decode: seconds per decoded image;
- injection: the plain denoiser's rows/s at the render's batch over its rows/s inside the render
  (the injecting attention processors);
- denoiser: plain rows/s at each batch the plans run (`production_plan`), the inputs the
  pipeline builds (`doctor_generators.denoiser_inputs`);
- CLIP filters: `images.score_pairs` with the ViT-L/14 filter model on a batch of pairs at the
  generator's resolution, seconds per pair.

On CUDA the pipeline is the production architecture with random weights in the generator's
dtype (the tiny pipeline's tokenizers and scheduler, `doctor_models`' rule: every tiny token id is
a production id and the padded lengths are the pipeline's); `tiny=True` (`--cpu-tiny`) runs the
same code on the tiny pipelines at 64 px in fp32: the code runs, the numbers mean nothing.
"""

from __future__ import annotations

import gc
import importlib
import inspect
import logging
import time
from collections import defaultdict
from pathlib import Path

log = logging.getLogger(__name__)

CAPTIONS = ("A man riding a brown horse.", "A man riding a brown elephant.")
TINY_SIDE = 64


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


class StageClock:
    """Seconds spent inside wrapped callables, by stage; `unwrap()` restores them."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.seconds: dict[str, float] = defaultdict(float)
        self._wrapped: list[tuple[object, str]] = []

    def wrap(self, stage: str, obj, attr: str) -> None:
        fn = getattr(obj, attr)

        def call(*args, **kwargs):
            _sync(self.device)
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            _sync(self.device)
            self.seconds[stage] += time.perf_counter() - start
            return out

        setattr(obj, attr, call)  # an instance attribute: nn.Module.__call__ reads self.forward
        self._wrapped.append((obj, attr))

    def unwrap(self) -> None:
        for obj, attr in self._wrapped:
            delattr(obj, attr)
        self._wrapped.clear()


def sd_pipeline(device: str, tiny: bool, tiny_dir: Path, dtype: str):
    """SD-1.5 with random weights at its real size (the tiny pipeline with `tiny`) in `dtype`."""
    from builders.devtools.doctor_generators import torch_dtype
    from builders.devtools.doctor_models import ModelSource
    from builders.models.profiles import tiny_profile

    pipe = ModelSource("tiny" if tiny else "production", tiny_profile(tiny_dir), device).get("sd")
    return pipe if dtype == "fp32" else pipe.to(torch_dtype(dtype))


def random_module(arch, device: str, dtype):
    """`arch` with normal(0, 0.02) weights made on `device` (no host copy of a 12B model)."""
    import torch

    from builders.models.production_configs import build_empty

    model = torch.nn.Module.to(build_empty(arch), dtype).to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
        for b in model.buffers():  # positional tables: their values do not change the work
            b.zero_()
    return model.eval()


def generator_pipeline(name: str, device: str, tiny: bool, tiny_dir: Path, dtype: str):
    """The generator's pipeline: the tiny one, or (not `tiny`) its production architecture with
    random weights around the tiny pipeline's tokenizers and scheduler."""
    from builders.counterfactuals.generators import GENERATORS
    from builders.devtools.doctor_generators import components, torch_dtype
    from builders.models.loaders import load_generator

    if name == "sd15":
        return sd_pipeline(device, tiny, tiny_dir, dtype)
    spec = GENERATORS[name]
    folder = tiny_dir / f"generator_{name}"
    if not (folder / "model_index.json").is_file():
        module, _, fn = spec.tiny.partition(":")
        getattr(importlib.import_module(module), fn)(folder)
    pipe = load_generator(spec.pipeline, str(folder), "cpu" if not tiny else device, "fp32")
    if tiny:
        return pipe
    parts = dict(pipe.components)
    for arch in components(name):
        parts[arch.name.split(".", 1)[1]] = random_module(arch, device, torch_dtype(dtype))
    cls = type(pipe)
    extra = {"add_watermarker": False} if "add_watermarker" in inspect.signature(cls).parameters else {}
    pipe = cls(**{k: v for k, v in parts.items() if k in inspect.signature(cls).parameters}, **extra)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def denoiser_of(pipe):
    return pipe.unet if hasattr(pipe, "unet") else pipe.transformer


def plain_rate(denoiser, rows: int, side: int, device: str, repeats: int) -> float:
    """Rows/s of the denoiser alone on `rows` rows at `side` px (fastest of `repeats`)."""
    import torch

    from builders.devtools.doctor_generators import denoiser_inputs
    from builders.devtools.generator_rates import timed

    inputs = denoiser_inputs(denoiser, rows, side, device, denoiser.dtype)
    with torch.no_grad():
        return rows / timed(lambda: denoiser(**inputs), device, repeats)


def render_stages(pipe, name: str, device: str, side: int, pairs: int, steps: int) -> dict[str, float]:
    """One render call of `pairs` candidate pairs (after a warm-up) with the stage timers:
    seconds of text encoding, of the denoiser and per decoded image; denoiser rows."""
    from builders.counterfactuals.config import ImageStageConfig
    from builders.counterfactuals.generators import GENERATORS
    from builders.counterfactuals.prompt_to_prompt import PairSpec, UNetWork

    spec, cfg = GENERATORS[name], ImageStageConfig()
    guidance = sum(spec.reference.guidance) / 2
    specs = [PairSpec(seed=k, p=0.5, guidance=guidance) for k in range(pairs)]
    options = {option: getattr(cfg, option) for option in spec.options}

    def once() -> UNetWork:
        work = UNetWork()
        spec.renderer()(pipe, *CAPTIONS, specs, steps=steps, size=side, share=False, work=work, **options)
        return work

    once()
    clock = StageClock(device)
    for attr in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        if getattr(pipe, attr, None) is not None:
            clock.wrap("text", getattr(pipe, attr), "forward")
    clock.wrap("denoiser", denoiser_of(pipe), "forward")
    clock.wrap("vae", pipe.vae, "decode")
    try:
        work = once()
    finally:
        clock.unwrap()
    return {
        "text_s": clock.seconds["text"],
        "denoiser_s": clock.seconds["denoiser"],
        "vae_s": clock.seconds["vae"] / max(work.decoded, 1),
        "rows": work.unet_rows,
    }


def clip_seconds(scorer, side: int, pairs: int, device: str) -> float:
    """Seconds per candidate pair of the CLIP filters (`score_pairs`) at `side` px."""
    import numpy as np

    from builders.counterfactuals.images import score_pairs
    from builders.devtools.generator_rates import timed

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (pairs, side, side, 3), dtype=np.uint8) for _ in range(2)]
    return timed(lambda: score_pairs(scorer, *CAPTIONS, *images), device, repeats=1) / pairs


def free(device: str) -> None:
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
