"""`counterfactory doctor vital-layers`: measure an MM-DiT's vital layers as Stable Flow does
(Avrahami et al., CVPR 2025, §3.1; builders/counterfactuals/METHOD.md §6).

For K (prompt, seed) pairs, the full model draws an image; then, for each transformer block in
turn, the same prompt and seed are drawn with that block bypassed (its output is its input: the
block's residual contribution to both streams is removed). Each bypassed image is compared with
the full model's by the cosine of their DINOv2 image embeddings (the CLS token of transformers'
`Dinov2Model`, as Stable Flow scores "perceptual similarity"); a block's score is the mean over
the K pairs. The blocks whose bypass changes the image most (lowest similarity) are vital: the
command prints the ranking and the `--top` most vital blocks as the list `--vital-layers` takes,
and writes them as JSON with their provenance (model and revision, DINOv2 model, prompts, seeds,
K, steps, size) for `--vital-layers-from`.

Block indices are `mmdit_edit.block_names`: FLUX's 19 double-stream blocks first, then its 38
single-stream blocks (Stable Flow's numbering, 0..56); SD3's joint blocks. The images are the
pipeline's own (`pipe(...)`) at the model's reference steps and guidance
(`generators.Reference`), so the measurement is of the model as the build runs it.

`--models tiny` measures the tiny random family of the generator (`builders.models.tiny_mmdit`)
with a tiny random DINOv2: a check that the command runs, whose ranking means nothing.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from builders.counterfactuals.generators import GENERATORS
from builders.engine.errors import UserFacingError
from builders.engine.option_types import check_image_side

log = logging.getLogger(__name__)

#: The published list lengths (builders/counterfactuals/METHOD.md §6): FLUX 9 blocks, SD3 4; `--top`'s default.
PUBLISHED_COUNT = {"flux": 9, "sd3": 4}
#: Default prompts (COCO-like scenes; Stable Flow used 64 prompts x seeds: give more with
#: `--prompts`).
DEFAULT_PROMPTS = (
    "a man riding a horse on a beach",
    "two dogs sleeping on a couch",
    "a red bus parked on a city street",
    "a bowl of fruit on a wooden table",
)
DEFAULT_DINO = "facebook/dinov2-base"
#: DINOv2's input: 224 px, ImageNet mean and standard deviation (its image processor's).
_DINO_SIDE, _MEAN, _STD = 224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass
class VitalLayersConfig:
    """Example: `VitalLayersConfig("flux", prompts=("a cat",), seeds=(0, 1))` (K = 2)."""

    generator: str
    #: Hub id or path (None: the generator's default model, or its tiny one under `tiny`).
    model: str | None = None
    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    seeds: tuple[int, ...] = (0,)
    #: None: the model's reference steps (`generators.Reference`); image side in pixels.
    steps: int | None = None
    size: int = 1024
    top: int | None = None
    dino_model: str = DEFAULT_DINO
    tiny: bool = False
    device: str = "cpu"
    dtype: str = "fp32"

    def __post_init__(self) -> None:
        if self.generator not in PUBLISHED_COUNT:
            raise UserFacingError(f"--generator takes {', '.join(PUBLISHED_COUNT)} (got {self.generator!r})")
        if not self.prompts or not self.seeds:
            raise UserFacingError("give at least one --prompts and one --seeds")
        if self.top is not None and self.top < 1:
            raise UserFacingError(f"--top takes a number >= 1 (got {self.top})")
        # The CLI's types check --steps and --seeds; the side depends on --generator.
        multiple = GENERATORS[self.generator].size_multiple
        check_image_side(self.size, multiple, "--image-size", f"the {self.generator} generator")


@dataclass
class VitalLayersResult:
    """Per block (`mmdit_edit.block_names` order) its mean DINOv2 similarity to the full model's
    image; `vital_layers`, the `top` lowest; `provenance`, what was measured."""

    blocks: list[str]
    similarity: list[float]
    vital_layers: list[int]
    provenance: dict[str, Any] = field(default_factory=dict)

    def ranking(self) -> list[int]:
        """Block indices, most vital (lowest similarity) first; ties by index."""
        return sorted(range(len(self.blocks)), key=lambda i: (self.similarity[i], i))


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


def measure(cfg: VitalLayersConfig, tiny_dir: Path | None = None) -> VitalLayersResult:
    """Load the generator and DINOv2, draw, bypass, rank (module docstring)."""
    import torch

    from builders.counterfactuals.generators import flux_t5_tokens, generator, generator_model
    from builders.counterfactuals.mmdit_edit import block_names
    from builders.engine.provenance import model_names
    from builders.models.loaders import load_generator
    from builders.models.profiles import default_tiny_dir
    from builders.models.tiny import build_once

    spec = generator(cfg.generator)
    tiny_dir = tiny_dir or default_tiny_dir()
    model = cfg.model or generator_model(spec, "tiny" if cfg.tiny else "production", "", tiny_dir)
    dino = build_once(tiny_dir / "dinov2", build_tiny_dinov2) if cfg.tiny else cfg.dino_model
    reference = spec.reference_for(model)
    steps = reference.steps if cfg.steps is None else cfg.steps
    pipe = load_generator(spec.pipeline, model, device=cfg.device, dtype=cfg.dtype)
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

    names = block_names(pipe.transformer.config)
    pairs = [(p, s) for p in cfg.prompts for s in cfg.seeds]
    similarity = rank_blocks(draw, embed, pipe.transformer, names, pairs)
    top = cfg.top or PUBLISHED_COUNT[cfg.generator]
    ranked = sorted(range(len(names)), key=lambda i: (similarity[i], i))
    named = model_names({"model": model, "dino": str(dino)})
    provenance = {
        "method": "Stable Flow bypass test (Avrahami et al., CVPR 2025, §3.1): DINOv2 CLS cosine of each "
        "block-bypassed image to the full model's, mean over prompt x seed pairs",
        "model": named["model"].split("@")[0],
        "revision": named["model"].split("@", 1)[1] if "@" in named["model"] else None,
        "dino_model": named["dino"],
        "prompts": list(cfg.prompts),
        "seeds": list(cfg.seeds),
        "k": len(pairs),
        "steps": steps,
        "guidance": reference.guidance[0],
        "size": cfg.size,
        "dtype": cfg.dtype,
        "top": top,
    }
    return VitalLayersResult(names, similarity, sorted(ranked[:top]), provenance)


def report(result: VitalLayersResult) -> str:
    """The ranking, most vital first, and the `--vital-layers` line."""
    lines = ["rank  block  name                              DINOv2 similarity", "-" * 64]
    for rank, i in enumerate(result.ranking(), 1):
        lines.append(f"{rank:>4}  {i:>5}  {result.blocks[i]:<32}  {result.similarity[i]:.4f}")
    layers = " ".join(map(str, result.vital_layers))
    lines.append(f"vital layers ({len(result.vital_layers)} most vital, by index): --vital-layers {layers}")
    return "\n".join(lines)


def check_output(path: Path) -> None:
    """Refuse an existing file before measuring (the result never overwrites one)."""
    if path.exists():
        raise UserFacingError(f"--output {path} exists: give a new path (nothing was overwritten)")


def write_result(path: Path, generator: str, result: VitalLayersResult) -> None:
    """The JSON `--vital-layers-from` reads. `generator`, `blocks` and the provenance's `model`
    and `revision` are the measured model's identity, which a build checks against the model it
    loads (builders/counterfactuals/vital_layers_file.py)."""
    check_output(path)
    data = {"generator": generator, **asdict(result)}
    path.write_text(json.dumps(data, indent=2) + "\n")
