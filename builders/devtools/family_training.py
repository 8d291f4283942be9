"""One optimizer step of a cross-encoder family's finetuning objective (training/itm_objectives.py:
BLIP's ITC + ITM with hard negatives, BridgeTower's ITM with in-batch hard negatives), on the
scoring backend the doctor and the production table build (builders/devtools/doctor_families.py:
the published architecture with random weights, or the tiny profile's model), through the
trainer's own step (`training.cross_training.cross_encoder_step`) and AdamW.

Used by `counterfactory doctor`'s `train-blip-base|blip-large|bridgetower` rows (memory per batch
at the recipe's batch size) and by `benchmarks/gpu_check.py`'s training rows (steps/s and peak
memory). BridgeTower's objective first scores every in-batch pair without gradient (B x B pairs in
one forward call), so its memory grows with the square of the batch: `square_pass` runs that
pass alone, so that its cost per pair is measured apart from the step's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

#: Examples (image + caption) a measured step holds: two images, so each has a negative.
STEP_EXAMPLES = 2
CAPTIONS = ("a dog sitting on a couch next to a lamp", "a cat sitting on a couch next to a lamp")


@dataclass(frozen=True)
class TrainRow:
    """A family's training row: its doctor stage, architecture and recipe."""

    stage: str
    #: Its `production_families` architecture (the ModelSource key of its scoring backend).
    arch: str
    #: The training recipe (training/config.py RECIPES) whose batch size the row reports.
    recipe: str
    models: str
    #: The objective scores the B x B in-batch pairs without gradient first.
    square: bool = False


TRAIN_ROWS = (
    TrainRow("train-blip-base", "blip_itm_base", "kim2023-blip", "BLIP ITM base (ViT-B/16)"),
    TrainRow("train-blip-large", "blip_itm_large", "kim2023-blip", "BLIP ITM large (ViT-L/16)"),
    TrainRow("train-bridgetower", "bridgetower_large_itm", "le2023-bridgetower", "BridgeTower large ITM", True),
)


def recipe_batch(recipe: str) -> int:
    from training.config import RECIPES

    return int(RECIPES[recipe]["optim"]["batch_size"])


class OneProcess:
    """The accelerator as a one-process step uses it, with the trainer's autocast under
    `--mixed-precision fp16` on CUDA (`fp16=True`)."""

    num_processes, process_index = 1, 0

    def __init__(self, device: str, fp16: bool = False) -> None:
        self.device, self.fp16 = device, fp16

    def autocast(self):
        import torch

        if self.fp16:
            return torch.autocast(device_type="cuda", dtype=torch.float16)
        return contextlib.nullcontext()

    def backward(self, loss) -> None:
        loss.backward()

    def no_sync(self, model):
        """Nothing to synchronise in one process (training/accumulation.py asks for it)."""
        return contextlib.nullcontext()


def training_backend(scoring):
    """The trainer's backend (`CrossEncoderTraining`) around a scoring backend's model: the same
    weights, in train mode, behind the family's objective module."""
    from training.cross_training import CrossEncoderTraining
    from training.itm_objectives import TRAINABLE

    model = scoring.module.model.requires_grad_(True)
    architecture = type(model).__name__
    module = TRAINABLE[architecture](model.train())
    return CrossEncoderTraining(scoring.clip, module, scoring.processor, model.config.model_type, architecture)


def example_batch(backend, n: int, device: str) -> dict:
    """`n` examples at the backend's input size: seeded random pixels, distinct captions, one image
    each."""
    import torch

    from training.data import to_device

    generator = torch.Generator().manual_seed(0)
    size = backend.image_size
    texts = [f"{CAPTIONS[k % 2]} number {k}" for k in range(n)]
    dtype = next(backend.module.parameters()).dtype
    batch = {
        "pixel_values": torch.randn(n, 3, size, size, generator=generator).to(dtype),
        "text": backend.tokenize(texts),
        "image_key": torch.arange(n),
    }
    return to_device(batch, device)


def optimizer_for(backend):
    import torch

    return torch.optim.AdamW([p for p in backend.module.parameters() if p.requires_grad], lr=1e-6)


def train_step(backend, batch: dict, optimizer, accelerator, seed: int = 0) -> dict[str, float]:
    """The trainer's forward + backward of the objective, then the optimizer step."""
    from training.cross_training import cross_encoder_step

    terms = cross_encoder_step(backend.module, batch, accelerator, backend, seed=seed)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return terms


def square_pass(backend, batch: dict, accelerator) -> int:
    """BridgeTower's no-gradient scoring of every in-batch pair, alone (the objective's own
    `_logits` on the B x B grid); the pairs it scored."""
    import torch

    module, pixels = backend.module, batch["pixel_values"]
    n = len(pixels)
    grid = torch.arange(n, device=pixels.device)
    with torch.no_grad(), accelerator.autocast():
        module._logits(pixels, batch["text"], grid.repeat_interleave(n), grid.repeat(n))
    return n * n
