"""`counterfactory doctor vital-layers`: measure an MM-DiT's vital layers as Stable Flow does
(Avrahami et al., "Stable Flow: Vital Layers for Training-Free Image Editing", CVPR 2025, §3.1;
builders/counterfactuals/METHOD.md §6).

For K samples (Stable Flow's K = 64 by default: sample i is prompt i mod P with seed `seed + i`),
the full model draws an image; then, for each transformer block in turn, the same samples are
drawn with that block bypassed (its output is its input: the block's residual contribution to
both streams is removed). Each bypassed image is compared with the full model's by the cosine of
their DINOv2 image embeddings (the CLS token of transformers' `Dinov2Model`, as Stable Flow
scores "perceptual similarity"); a block's score is the mean over the K samples.

The vital set is read off the ranking by a stated rule (Stable Flow picks its set from its ranking
of the 57 FLUX blocks, §3.1; this rule makes the choice stated and reproducible): the blocks
before the ranking's knee, the knee being Kneedle's (Satopää, Albrecht, Irwin, Raghavan, "Finding a 'Kneedle' in a
Haystack", ICDCS Workshops 2011): with the similarities sorted ascending and both axes scaled to
[0, 1], the rank where the sorted curve stands furthest above its chord (the maximum of the
difference curve y - x). A ranking with no knee (all scores equal, as on a tiny random model,
or a curve that never rises above its chord) has no vital block. `--top N` takes the N most
vital instead (refused when N exceeds the block count). The command prints every block's score
and the set, and writes them as JSON with the measured model's identity (id, revision, the
sha256 of its denoiser `config.json`, its blocks) and the measurement's provenance (DINOv2
model, prompts, seeds, K, steps, size) for `--vital-layers-from`.

Block indices are `vital_layers_file.block_names`: FLUX's 19 double-stream blocks first, then its 38
single-stream blocks (Stable Flow's numbering, 0..56); SD3's joint blocks. The model measured by
default is the one the published list comes from (FLUX: FLUX.1-dev, Stable Flow's model; SD3:
SD3-medium, the build's default, with no published measurement), drawn by the pipeline's own
`pipe(...)` at its reference steps and guidance (`model_references`, decided from its configs).

`--models tiny` measures the tiny random family of the generator (`builders.models.tiny_mmdit`)
with a tiny random DINOv2, at `TINY_STEPS` steps and `TINY_SAMPLES` samples unless given: a
check that the command runs (within a minute on a CPU), whose ranking means nothing.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from builders.counterfactuals.generators import GENERATORS
from builders.counterfactuals.vital_layers_file import PUBLISHED_ON
from builders.engine.errors import UserFacingError
from builders.engine.option_types import SEED_LIMIT, check_image_side

log = logging.getLogger(__name__)

#: The model measured by default: FLUX.1-dev, the model Stable Flow measured its published list on
#: (builders/counterfactuals/METHOD.md §6); SD3-medium, the build's default (no published list).
MEASURED_MODEL = {"flux": PUBLISHED_ON["flux"], "sd3": GENERATORS["sd3"].default_model}
#: Stable Flow's sample size: K = 64 prompt x seed samples (§3.1).
SAMPLE_SIZE = 64
#: The tiny profile's defaults: a check that runs within a minute on a CPU (its ranking means
#: nothing), not a measurement.
TINY_STEPS, TINY_SAMPLES = 2, 4
#: Default prompts (COCO-like scenes), cycled over the samples; Stable Flow drew random prompts:
#: give more with `--prompts`.
DEFAULT_PROMPTS = (
    "a man riding a horse on a beach",
    "two dogs sleeping on a couch",
    "a red bus parked on a city street",
    "a bowl of fruit on a wooden table",
)
DEFAULT_DINO = "facebook/dinov2-base"
#: DINOv2's input: 224 px, ImageNet mean and standard deviation (its image processor's).
_DINO_SIDE, _MEAN, _STD = 224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
#: How the set is read off the ranking (recorded in the JSON and printed).
KNEE_RULE = (
    "the blocks ranked before the knee of the ascending similarity ranking (Kneedle, Satopaa et al. "
    "2011: the maximum of the scaled curve's height above its chord)"
)


@dataclass
class VitalLayersConfig:
    """Example: `VitalLayersConfig("flux", prompts=("a cat",), samples=2)` (K = 2: seeds 0, 1)."""

    generator: str
    #: Hub id or path (None: `MEASURED_MODEL`, or the tiny one under `tiny`).
    model: str | None = None
    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    #: K; None: `SAMPLE_SIZE` (tiny: `TINY_SAMPLES`). Sample i: prompt i mod P, seed `seed + i`.
    samples: int | None = None
    seed: int = 0
    #: None: the model's reference steps (tiny: `TINY_STEPS`); image side in pixels.
    steps: int | None = None
    size: int = 1024
    #: None: the set is read off the ranking (`knee_layers`); N: the N most vital.
    top: int | None = None
    dino_model: str = DEFAULT_DINO
    tiny: bool = False
    device: str = "cpu"
    dtype: str = "fp32"

    def __post_init__(self) -> None:
        if self.generator not in MEASURED_MODEL:
            raise UserFacingError(f"--generator takes {', '.join(MEASURED_MODEL)} (got {self.generator!r})")
        if not self.prompts:
            raise UserFacingError("give at least one --prompts")
        for flag, value in (("--samples", self.samples), ("--top", self.top)):
            if value is not None and value < 1:
                raise UserFacingError(f"{flag} takes a number >= 1 (got {value})")
        # The CLI's types check --steps and --seed; sample i draws seed --seed + i, so the last
        # one must be a seed too; the side depends on --generator.
        last = self.pairs()[-1][1]
        if last >= SEED_LIMIT:
            raise UserFacingError(f"--seed {self.seed}: its samples draw seeds up to {last}, past {SEED_LIMIT - 1}")
        multiple = GENERATORS[self.generator].size_multiple
        check_image_side(self.size, multiple, "--image-size", f"the {self.generator} generator")

    def pairs(self) -> list[tuple[str, int]]:
        """The K (prompt, seed) samples."""
        k = self.samples or (TINY_SAMPLES if self.tiny else SAMPLE_SIZE)
        return [(self.prompts[i % len(self.prompts)], self.seed + i) for i in range(k)]


@dataclass
class VitalLayersResult:
    """Per block (`vital_layers_file.block_names` order) its mean DINOv2 similarity to the full model's
    image; `vital_layers`, the set read off the ranking; `provenance`, what was measured."""

    blocks: list[str]
    similarity: list[float]
    vital_layers: list[int]
    provenance: dict[str, Any] = field(default_factory=dict)

    def ranking(self) -> list[int]:
        """Block indices, most vital (lowest similarity) first; ties by index."""
        return ranking(self.similarity)


def ranking(similarity: Sequence[float]) -> list[int]:
    """Block indices, most vital (lowest similarity) first; ties by index."""
    return sorted(range(len(similarity)), key=lambda i: (similarity[i], i))


def knee_layers(similarity: Sequence[float]) -> list[int]:
    """The vital set by `KNEE_RULE` (module docstring), sorted by index: the blocks ranked before
    the knee; none where the ranking has no knee (equal scores, or no point above the chord)."""
    order = ranking(similarity)
    y = np.array([similarity[i] for i in order], dtype=float)
    if len(y) < 3 or y[-1] - y[0] <= 0:
        return []
    x = np.arange(len(y)) / (len(y) - 1)
    height = (y - y[0]) / (y[-1] - y[0]) - x
    knee = int(np.argmax(height))  # the first maximum; 0 when no point is above the chord
    return sorted(order[:knee]) if height[knee] > 0 else []


def check_top(top: int | None, blocks: Sequence[str]) -> None:
    """`--top` at most the model's block count (otherwise every block would be "vital")."""
    if top is not None and top > len(blocks):
        raise UserFacingError(
            f"--top {top} is more than this transformer's {len(blocks)} blocks: give at most {len(blocks)}, "
            "or leave --top out to read the set off the ranking"
        )


def bypassed(block) -> Callable[[], None]:
    """Make `block` return its input unchanged (both streams), as Stable Flow's bypass; returns
    the function that undoes it. MM-DiT blocks (diffusers' `FluxTransformerBlock`,
    `FluxSingleTransformerBlock`, `JointTransformerBlock`) take `hidden_states,
    encoder_hidden_states` and return `(encoder_hidden_states, hidden_states)`."""

    def identity(_module, args, kwargs, _output):
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        text = kwargs["encoder_hidden_states"] if "encoder_hidden_states" in kwargs else args[1]
        return text, hidden

    return block.register_forward_hook(identity, with_kwargs=True).remove


def rank_blocks(
    draw: Callable[[str, int], np.ndarray],
    embed: Callable[[np.ndarray], np.ndarray],
    transformer,
    names: Sequence[str],
    pairs: Sequence[tuple[str, int]],
) -> list[float]:
    """Mean cosine similarity, per block of `names`, between the image `draw(prompt, seed)` makes
    with that block bypassed and the full model's, over `pairs` (`embed`: unit-norm rows)."""
    full = embed(np.stack([draw(p, s) for p, s in pairs]))
    scores = []
    for name in names:
        undo = bypassed(transformer.get_submodule(name))
        try:
            cut = embed(np.stack([draw(p, s) for p, s in pairs]))
        finally:
            undo()
        scores.append(float(np.mean(np.sum(full * cut, axis=1))))
        log.info("%s bypassed: DINOv2 similarity %.4f", name, scores[-1])
    return scores


def dino_embedder(model_id: str, device: str) -> Callable[[np.ndarray], np.ndarray]:
    """uint8 images `(n, h, w, 3)` -> unit-norm DINOv2 CLS embeddings (float64 numpy)."""
    import torch
    import torch.nn.functional as F
    from transformers import Dinov2Model

    model = Dinov2Model.from_pretrained(model_id).to(device).eval()
    mean = torch.tensor(_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(_STD, device=device).view(1, 3, 1, 1)

    @torch.inference_mode()
    def embed(images: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(images).to(device).permute(0, 3, 1, 2).float() / 255
        x = F.interpolate(x, size=(_DINO_SIDE, _DINO_SIDE), mode="bicubic", align_corners=False)
        cls = model(pixel_values=(x - mean) / std).pooler_output.double()
        return F.normalize(cls, dim=-1).cpu().numpy()

    return embed


def build_tiny_dinov2(out_dir: str | Path) -> Path:
    """A tiny random-init `Dinov2Model` (the tiny profile's DINOv2: `--models tiny`)."""
    import torch
    from transformers import Dinov2Config, Dinov2Model

    from builders.models.tiny import SEED

    torch.manual_seed(SEED)
    cfg = Dinov2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, image_size=_DINO_SIDE
    )
    Dinov2Model(cfg).save_pretrained(out_dir)
    return Path(out_dir)


def measured_model(cfg: VitalLayersConfig, tiny_dir: Path) -> str:
    """The model `cfg` measures: `--generator-model`, else the tiny one or `MEASURED_MODEL`."""
    if cfg.model:
        return cfg.model
    if cfg.tiny:
        from builders.counterfactuals.generators import generator, generator_model

        return generator_model(generator(cfg.generator), "tiny", "", tiny_dir)
    return MEASURED_MODEL[cfg.generator]


def measure(cfg: VitalLayersConfig, tiny_dir: Path | None = None) -> VitalLayersResult:
    """Load the generator and DINOv2, draw, bypass, rank, read the set (module docstring).
    `--top` beyond the block count is refused once the model's blocks are known, before drawing."""
    import torch

    from builders.counterfactuals.generators import flux_t5_tokens, generator
    from builders.counterfactuals.vital_layers_file import block_names
    from builders.counterfactuals.vital_layers_file import config_sha256, read_denoiser_config
    from builders.models.loaders import load_generator
    from builders.models.profiles import default_tiny_dir
    from builders.models.tiny import build_once

    spec = generator(cfg.generator)
    tiny_dir = tiny_dir or default_tiny_dir()
    model = measured_model(cfg, tiny_dir)
    dino = build_once(tiny_dir / "dinov2", build_tiny_dinov2) if cfg.tiny else cfg.dino_model
    reference = spec.reference_for(model)
    steps = cfg.steps or (TINY_STEPS if cfg.tiny else reference.steps)
    pipe = load_generator(spec.pipeline, model, device=cfg.device, dtype=cfg.dtype)
    names = block_names(pipe.transformer.config)
    check_top(cfg.top, names)
    embed = dino_embedder(str(dino), cfg.device)
    # FLUX at the T5 length the build reads (schnell 256, dev 512).
    text = {"max_sequence_length": flux_t5_tokens(pipe)} if cfg.generator == "flux" else {}

    def draw(prompt: str, seed: int) -> np.ndarray:
        image = pipe(
            prompt,
            height=cfg.size,
            width=cfg.size,
            num_inference_steps=steps,
            guidance_scale=reference.guidance[0],
            generator=torch.Generator("cpu").manual_seed(seed),
            output_type="np",
            **text,
        ).images[0]
        return (image * 255).round().astype(np.uint8)

    pairs = cfg.pairs()
    similarity = rank_blocks(draw, embed, pipe.transformer, names, pairs)
    vital = sorted(ranking(similarity)[: cfg.top]) if cfg.top else knee_layers(similarity)
    sha = config_sha256(read_denoiser_config(model))
    drawn = {"config_sha256": sha, "steps": steps, "guidance": reference.guidance[0]}
    return VitalLayersResult(names, similarity, vital, provenance(cfg, model, str(dino), pairs, drawn))


def provenance(cfg: VitalLayersConfig, model: str, dino: str, pairs: list, drawn: dict[str, Any]) -> dict[str, Any]:
    """What was measured: the model's identity (as `vital_layers_file` checks it), the sample,
    the settings and the rule that read the set."""
    from builders.engine.provenance import model_names

    named = model_names({"model": model, "dino": dino})
    return {
        "method": "Stable Flow bypass test (Avrahami et al., CVPR 2025, §3.1): DINOv2 CLS cosine of each "
        "block-bypassed image to the full model's, mean over K prompt x seed samples",
        "model": named["model"].split("@")[0],
        "revision": named["model"].split("@", 1)[1] if "@" in named["model"] else None,
        "config_sha256": drawn["config_sha256"],
        "dino_model": named["dino"],
        "prompts": [p for p, _ in pairs],
        "seeds": [s for _, s in pairs],
        "k": len(pairs),
        "steps": drawn["steps"],
        "guidance": drawn["guidance"],
        "size": cfg.size,
        "dtype": cfg.dtype,
        "rule": f"the {cfg.top} most vital (--top)" if cfg.top else KNEE_RULE,
        "top": cfg.top,
    }


def report(result: VitalLayersResult) -> str:
    """Every block's score, most vital first, marked where vital, and the `--vital-layers` line."""
    vital = set(result.vital_layers)
    lines = ["rank  block  name                              DINOv2 similarity  vital", "-" * 71]
    for rank, i in enumerate(result.ranking(), 1):
        mark = "yes" if i in vital else ""
        # Six decimals: the rule is scale-free, so differences below 1e-4 can decide the set.
        lines.append(f"{rank:>4}  {i:>5}  {result.blocks[i]:<32}  {result.similarity[i]:>17.6f}  {mark}")
    rule = result.provenance.get("rule", KNEE_RULE)
    if not result.vital_layers:
        lines.append(f"no vital layers by {rule}: the ranking has no knee (give --top N to take the N most vital)")
        return "\n".join(lines)
    layers = " ".join(map(str, result.vital_layers))
    lines.append(f"vital layers ({len(result.vital_layers)}: {rule}): --vital-layers {layers}")
    return "\n".join(lines)


def check_output(path: Path) -> None:
    """Refuse an existing file before measuring (the result never overwrites one)."""
    if path.exists():
        raise UserFacingError(f"--output {path} exists: give a new path (nothing was overwritten)")


def write_result(path: Path, generator: str, result: VitalLayersResult) -> None:
    """The JSON `--vital-layers-from` reads. `generator`, `blocks` and the provenance's `model`,
    `revision` and `config_sha256` are the measured model's identity, which a build checks against the model it
    loads (builders/counterfactuals/vital_layers_file.py)."""
    check_output(path)
    data = {"generator": generator, **asdict(result)}
    path.write_text(json.dumps(data, indent=2) + "\n")
