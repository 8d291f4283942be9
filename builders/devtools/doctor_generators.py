"""`counterfactory doctor`'s generator rows: per image-stage generator (`--generator sd15|sdxl|
sd3|flux`) the weights per dtype, the activation memory of one candidate pair at the model's
production resolution, and the pairs per batch that fit a 24 / 40 / 80 GB GPU, with all
components resident and with `--cpu-offload` (one component on the GPU at a time).

The architectures are the published ones (`production_configs`, `production_generators`). How
the activations are found depends on whether the model fits this machine:

- measured, as the doctor's stages are: the real-size model with random weights on this
  process's device, its peak memory (`PeakMemory`) over one denoiser forward of a pair's rows and
  the VAE decode of its two images, at `--resolution` scaled to the model's own (x2 for the 1024 px
  models) and extrapolated by area; on the CPU in fp32, halved for fp16/bf16;
- meta-device arithmetic where the fp32 weights would take more than half of the free memory
  (SDXL, SD3 and FLUX on a 24 GB machine, or `--models tiny`): the same forward on the meta device
  (shapes only) at the production resolution and dtype, counting the bytes of every tensor it
  allocates while that tensor is alive (`LiveTensorBytes`); attention is counted as the fused
  SDPA kernels of a GPU run it (output only, no tokens x tokens score matrix).

A pair's denoiser rows: 4 with classifier-free guidance (original + counterfactual, each with an
unconditional and a conditional half: sd15, sdxl, sd3), 2 for FLUX.1-schnell (timestep-distilled,
no guidance). The text encoders run once per caption pair: their weights count, their
activations (one 77-token or 256-token batch) do not. The per-pair peak is the larger of the
denoiser's and the decode's, which run one after the other.
"""

from __future__ import annotations

import functools
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any

from builders.engine.errors import UserFacingError

log = logging.getLogger(__name__)

GENERATORS = ("sd15", "sdxl", "sd3", "flux")
GIB = 1 << 30
MIB = 1 << 20
#: T5 tokens of a caption (SD3's and FLUX.1-schnell's pipelines: max_sequence_length 256).
T5_TOKENS = 256
CLIP_TOKENS = 77


@dataclass(frozen=True)
class GeneratorShape:
    name: str
    #: Production image side (px).
    resolution: int
    #: The dtype it runs in (`fp16`, or `bf16` for FLUX, whose activations overflow fp16).
    dtype: str
    #: Denoiser rows per candidate pair and step.
    rows_per_pair: int
    #: The pipeline decodes in fp32 (SDXL's: its VAE config's `force_upcast`, an fp16 overflow).
    vae_fp32: bool = False


#: Denoising steps are the reference settings' (`GENERATORS[name].reference.steps`), read where
#: a throughput needs them, never copied here.
SHAPES = {
    "sd15": GeneratorShape("sd15", 512, "fp16", 4),
    "sdxl": GeneratorShape("sdxl", 1024, "fp16", 4, vae_fp32=True),
    "sd3": GeneratorShape("sd3", 1024, "fp16", 4),
    "flux": GeneratorShape("flux", 1024, "bf16", 2),
}


@dataclass
class GeneratorRow:
    generator: str
    model: str
    params: int
    dtype: str
    #: `fp32` and the run dtype -> GiB of all components.
    weights_gib: dict[str, float]
    #: The largest component at the run dtype: what `--cpu-offload` keeps on the GPU.
    largest_component_gib: float
    resolution: int
    rows_per_pair: int
    denoiser_mib_per_pair: float
    decode_mib_per_pair: float
    activation_mib_per_pair: float
    #: GPU GiB -> candidate pairs per batch with every component on the GPU.
    batch: dict[str, int] = field(default_factory=dict)
    #: GPU GiB -> pairs per batch under `--cpu-offload`.
    batch_cpu_offload: dict[str, int] = field(default_factory=dict)
    #: `measured ...` or `meta-device arithmetic ...`.
    how: str = ""
    note: str = ""


class LiveTensorBytes:
    """Peak bytes of the tensors allocated inside the block while they are alive (inputs and
    parameters made before it are not counted). Works on the meta device, where nothing is
    allocated: a tensor's bytes are its shape times its element size. Views and in-place results
    share their source's storage and are not counted again."""

    def __init__(self) -> None:
        self.live = self.peak = 0
        self._holders: dict[int, list] = {}
        self._mode = None

    def __enter__(self) -> LiveTensorBytes:
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                tracker._record(func, out)
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)

    def _record(self, func, out) -> None:
        import torch
        from torch.utils._pytree import tree_flatten

        aliasing = any(r.alias_info is not None for r in func._schema.returns)
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            key = t.untyped_storage()._cdata
            if key in self._holders:
                self._hold(key, t, 0)
            elif not aliasing:
                self._hold(key, t, t.untyped_storage().nbytes())

    def _hold(self, key: int, tensor, nbytes: int) -> None:
        """Count `nbytes` for storage `key` until the last tensor seen on it is freed."""
        holders = self._holders.setdefault(key, [0, nbytes])
        holders[0] += 1
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(tensor, self._release, key)

    def _release(self, key: int) -> None:
        holders = self._holders[key]
        holders[0] -= 1
        if holders[0] == 0:
            self.live -= holders[1]
            del self._holders[key]


def fused_attention(query, key, value, *args, **kwargs):
    """Stand-in for `scaled_dot_product_attention` on the meta device, whose math path holds the
    tokens x tokens scores: the memory of the fused kernels a GPU runs (their output only)."""
    return query.new_empty(*query.shape[:-1], value.shape[-1])


def denoiser_inputs(model, rows: int, side: int, device, dtype) -> dict[str, Any]:
    """Keyword inputs of one forward of `rows` rows at `side` px, for each denoiser family, as its
    pipeline builds them (text widths and pooled sizes read from the model's config)."""
    import torch

    cfg, latent = model.config, side // 8

    def empty(*shape):
        return (
            torch.randn(*shape, device=device, dtype=dtype)
            if device != "meta"
            else torch.empty(*shape, device=device, dtype=dtype)
        )

    timestep = torch.full((rows,), 500.0, device=device, dtype=dtype)
    kind = type(model).__name__
    if kind == "UNet2DConditionModel":
        inputs = {
            "sample": empty(rows, cfg.in_channels, latent, latent),
            "timestep": timestep,
            "encoder_hidden_states": empty(rows, CLIP_TOKENS, cfg.cross_attention_dim),
        }
        if cfg.addition_embed_type == "text_time":  # SDXL: pooled text + 6 size/crop ids
            pooled = cfg.projection_class_embeddings_input_dim - 6 * cfg.addition_time_embed_dim
            inputs["added_cond_kwargs"] = {"text_embeds": empty(rows, pooled), "time_ids": empty(rows, 6)}
        return inputs
    if kind == "SD3Transformer2DModel":  # CLIP tokens padded to T5's width, then T5's tokens
        return {
            "hidden_states": empty(rows, cfg.in_channels, latent, latent),
            "timestep": timestep,
            "encoder_hidden_states": empty(rows, CLIP_TOKENS + T5_TOKENS, cfg.joint_attention_dim),
            "pooled_projections": empty(rows, cfg.pooled_projection_dim),
        }
    if kind == "FluxTransformer2DModel":  # 2x2 latent patches packed into tokens
        tokens = (latent // 2) ** 2
        inputs = {
            "hidden_states": empty(rows, tokens, cfg.in_channels),
            "timestep": timestep / 1000,
            "encoder_hidden_states": empty(rows, T5_TOKENS, cfg.joint_attention_dim),
            "pooled_projections": empty(rows, cfg.pooled_projection_dim),
            "img_ids": torch.zeros(tokens, 3, device=device, dtype=dtype),
            "txt_ids": torch.zeros(T5_TOKENS, 3, device=device, dtype=dtype),
        }
        if cfg.guidance_embeds:
            inputs["guidance"] = torch.full((rows,), 3.5, device=device, dtype=dtype)
        return inputs
    raise ValueError(f"no inputs for denoiser {kind}")


def torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def components(generator: str) -> list:
    from builders.models.production_generators import GENERATOR_COMPONENTS, arch

    return [arch(name) for name in GENERATOR_COMPONENTS[generator]]


@functools.lru_cache(maxsize=None)
def _empty(name: str):
    """Component `name` on the meta device, built once per process (FLUX's take seconds)."""
    from builders.models.production_configs import build_empty
    from builders.models.production_generators import arch

    return build_empty(arch(name))


def _cast(model, dtype):
    # nn.Module.to itself: diffusers' override warns about fp32-kept modules it has none of.
    import torch

    return torch.nn.Module.to(model, dtype)


def parameter_counts(generator: str) -> list[int]:
    """Distinct parameters of each component, denoiser first (meta device: no memory)."""
    from builders.models.production_configs import parameter_count

    return [parameter_count(_empty(a.name)) for a in components(generator)]


def _forward_peaks(denoiser, vae, rows: int, side: int, device: str, dtype, probe) -> tuple[int, int]:
    """(denoiser, decode) peak bytes of one pair: `rows` denoiser rows, then 2 images decoded,
    each under a fresh `probe()` (a context with `.peak` and `.base`)."""
    import torch

    vae_dtype = next(vae.parameters()).dtype
    with torch.no_grad():
        inputs = denoiser_inputs(denoiser, rows, side, device, dtype)
        with probe() as den:
            denoiser(**inputs)
        del inputs
        latents = torch.zeros(2, vae.config.latent_channels, side // 8, side // 8, device=device, dtype=vae_dtype)
        with probe() as dec:
            vae.decode(latents)
    return max(den.peak - den.base, 0), max(dec.peak - dec.base, 0)


def activations_meta(generator: str) -> tuple[int, int]:
    """(denoiser, decode) bytes per pair at the production resolution and dtype, on the meta
    device."""
    from unittest import mock

    shape, archs = SHAPES[generator], components(generator)
    dtype = torch_dtype(shape.dtype)
    denoiser = _cast(_empty(archs[0].name), dtype)
    vae = _cast(_empty(archs[-1].name), torch_dtype("fp32") if shape.vae_fp32 else dtype)

    class Probe(LiveTensorBytes):
        base = 0

    with mock.patch("torch.nn.functional.scaled_dot_product_attention", fused_attention):
        return _forward_peaks(denoiser, vae, shape.rows_per_pair, shape.resolution, "meta", dtype, Probe)


def activations_measured(generator: str, side: int, device: str) -> tuple[int, int]:
    """(denoiser, decode) bytes per pair measured at `side` px on `device`: the real-size
    components with random weights, in fp32 on the CPU, in the run dtype on CUDA."""
    from builders.devtools.peak_memory import PeakMemory
    from builders.models.production_configs import build_random

    shape, archs = SHAPES[generator], components(generator)
    cuda = device.startswith("cuda")
    dtype = torch_dtype(shape.dtype if cuda else "fp32")
    denoiser = _cast(build_random(archs[0]).to(device), dtype)
    vae = _cast(build_random(archs[-1]).to(device), torch_dtype("fp32") if shape.vae_fp32 else dtype)
    return _forward_peaks(denoiser, vae, shape.rows_per_pair, side, device, dtype, lambda: PeakMemory(device))


def free_bytes(device: str) -> int:
    """Memory this process could still use on `device`."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(device)[0]
    import psutil

    return psutil.virtual_memory().available


def generator_row(generator: str, *, measure_on: str | None = None, resolution: int = 512) -> GeneratorRow:
    """`generator`'s row: measured on `measure_on` (a device) at `resolution` px scaled to the
    model's own, or by meta-device arithmetic when `measure_on` is None."""
    from builders.devtools.doctor import GPU_GIB, fitting_batch
    from builders.models.production_generators import GENERATOR_COMPONENTS

    shape = SHAPES[generator]
    counts = parameter_counts(generator)
    params = sum(counts)
    upcast = shape.vae_fp32
    static = params * 2 + (counts[-1] * 2 if upcast else 0)
    if measure_on is None:
        (den, dec), how = activations_meta(generator), "meta-device arithmetic"
    else:
        side = resolution * shape.resolution // 512
        den, dec = activations_measured(generator, side, measure_on)
        # On the CPU the fp32 run stands for fp16/bf16: half the bytes (the upcast decode stays).
        half = 1 if measure_on.startswith("cuda") else 2
        scale = (shape.resolution / side) ** 2
        den, dec = int(den / half * scale), int(dec / (1 if upcast else half) * scale)
        how = f"measured on {measure_on} ({'fp32, halved' if half == 2 else shape.dtype}) at {side} px" + (
            f", activations x{scale:g} to {shape.resolution} px" if scale != 1 else ""
        )
    per_pair = max(den, dec, MIB)
    row = GeneratorRow(
        generator=generator,
        model=components(generator)[0].model_id,
        params=params,
        dtype=shape.dtype,
        weights_gib={"fp32": round(params * 4 / GIB, 2), shape.dtype: round(params * 2 / GIB, 2)},
        largest_component_gib=round(max(counts) * 2 / GIB, 2),
        resolution=shape.resolution,
        rows_per_pair=shape.rows_per_pair,
        denoiser_mib_per_pair=round(den / MIB, 1),
        decode_mib_per_pair=round(dec / MIB, 1),
        activation_mib_per_pair=round(per_pair / MIB, 1),
        batch={str(g): fitting_batch(g, static, per_pair) for g in GPU_GIB},
        batch_cpu_offload={str(g): fitting_batch(g, max(counts) * 2, per_pair) for g in GPU_GIB},
        how=how,
    )
    row.note = (
        f"per pair: denoiser {row.denoiser_mib_per_pair:.0f} MiB ({shape.rows_per_pair} "
        f"rows), decode {row.decode_mib_per_pair:.0f} MiB (2 images); "
        + holding_note(row, len(GENERATOR_COMPONENTS[generator]), static, upcast)
    )
    return row


def holding_note(row: GeneratorRow, n_components: int, static: int, upcast: bool) -> str:
    """Which GPUs hold the model and a batch of pairs in its dtype, which hold its weights but not
    one pair, which only with `--cpu-offload`, which not at all."""
    from builders.devtools.doctor import HEADROOM

    holds = [g for g, n in row.batch.items() if n > 0]
    weights_only = [g for g, n in row.batch.items() if n == 0 and static <= HEADROOM * int(g) * GIB]
    offload = [g for g, n in row.batch_cpu_offload.items() if n > 0 and g not in holds]
    none = [g for g, n in row.batch_cpu_offload.items() if n == 0]
    parts = [
        f"{row.dtype} weights {row.weights_gib[row.dtype]:.1f} GiB ({n_components} "
        f"components): {'/'.join(holds) or 'no'} GB GPUs hold it and a batch of pairs"
    ]
    if weights_only:
        parts.append(
            f"{'/'.join(weights_only)} GB hold the weights but not one pair's {row.activation_mib_per_pair:.0f} MiB"
        )
    if offload:
        parts.append(
            f"{'/'.join(offload)} GB with --cpu-offload (one component on the GPU at a "
            f"time, the largest {row.largest_component_gib:.1f} GiB)"
        )
    if none:
        parts.append(
            f"{'/'.join(none)} GB not even with --cpu-offload (the largest component "
            f"alone, {row.largest_component_gib:.1f} GiB, exceeds 90% of it)"
        )
    if upcast:
        parts.append("its VAE decodes in fp32 (force_upcast)")
    return "; ".join(parts)


def check_generators(names) -> None:
    """`--generators` names checked before anything runs: one line naming the flag."""
    unknown = [name for name in names if name not in GENERATORS]
    if unknown:
        raise UserFacingError(
            f"--generators: unknown generator(s) {', '.join(unknown)}; choose from {', '.join(GENERATORS)}, or none"
        )


def run_generators(names, *, production: bool, resolution: int, device: str, on_row=None) -> list[GeneratorRow]:
    """A row per generator in `names`: measured where the production model fits this device
    (`production` and its fp32 weights within half of the free memory), else meta-device
    arithmetic, which the row says."""
    rows = []
    for name in names:
        params = sum(parameter_counts(name))
        free = free_bytes(device)
        fits = production and params * 4 <= free / 2
        log.info("doctor: generator %s (%s)", name, "measured" if fits else "meta device")
        row = generator_row(name, measure_on=device if fits else None, resolution=resolution)
        if not fits:
            why = (
                "--models tiny"
                if not production
                else f"its fp32 weights, {params * 4 / GIB:.1f} GiB, exceed half of the "
                f"{free / GIB:.1f} GiB free on {device}"
            )
            row.how += f" ({why}; production shapes at {row.resolution} px, {row.dtype})"
        rows.append(row)
        if on_row:
            on_row(row)
    return rows


GENERATOR_HEADER = (
    f"{'generator':<10}{'weights GiB fp32/run':>22}{'act MiB/pair':>14}{'px':>6}  "
    f"{'pairs @24/40/80 GB':<20}{'--cpu-offload':<15}model; how; note"
)


def format_generator_row(r: GeneratorRow) -> str:
    batches = "/".join(str(r.batch[k]) for k in r.batch)
    offload = "/".join(str(r.batch_cpu_offload[k]) for k in r.batch_cpu_offload)
    weights = f"{r.weights_gib['fp32']:.1f}/{r.weights_gib[r.dtype]:.1f} {r.dtype}"
    return (
        f"{r.generator:<10}{weights:>22}{r.activation_mib_per_pair:>14.1f}{r.resolution:>6}  "
        f"{batches:<20}{offload:<15}{r.model}; {r.how}; {r.note}"
    )
