"""One optimizer step's forward and backward over `--grad-accum` micro-batches, keeping the
contrastive batch whole (as open_clip's `--accum-freq`).

Each micro-batch alone would see only its own negatives: 64 x 4 would not be a batch of 256. So
a first pass encodes every micro-batch without gradient and caches its (global) features; then
each micro-batch is encoded again with gradient and the loss of the *whole* batch is computed with
its rows live and every other row from the cache. Summing those backward passes gives exactly the
full batch's gradient: pass j contributes d(loss)/d(features of j) x d(features of j)/d(weights),
and the passes together cover every row once. The logit scale enters every pass, so it is live
in the last pass only, else its gradient would count `accum` times. Memory: the encoder
activations of one micro-batch plus the features of all (the point of it), at the cost of one
extra forward without gradient per micro-batch. The same holds for the sigmoid loss (`--loss
siglip`), whose logit bias is live in the last pass only, as the scale.

With one micro-batch it is the plain step (no cache pass). Across processes each micro-batch's
features are gathered as in training/losses.py, so the batch is global and the loss of N
processes equals one process's (the trainer multiplies by the process count: DDP averages).
Rows of a pair sit in one micro-batch (training/data.py), hence in the one contrastive batch.
"""

from __future__ import annotations

import contextlib

import torch

from training.losses import clip_loss, gather_global, siglip_loss

#: Per micro-batch: global image, text and negative features and the negatives' mask.
Features = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def _global_features(model, batch: dict, accelerator, loss: str) -> tuple[Features, tuple]:
    """The micro-batch's features over all processes (ours keep their graph) and the logit
    scale (and, for the sigmoid loss, the logit bias), through the model's forward so that DDP
    sees them used."""
    inputs = dict(pixel_values=batch["pixel_values"], text=batch["text"], negative_text=batch.get("negative_text"))
    if loss == "siglip":
        img, txt, neg, *logit = model(**inputs, with_bias=True)
    else:
        img, txt, neg, *logit = model(**inputs)
    mask = batch.get("negative_mask")
    gathered = (
        gather_global(img, accelerator),
        gather_global(txt, accelerator),
        gather_global(neg, accelerator) if neg is not None else None,
        gather_global(mask, accelerator) if mask is not None else None,
    )
    return gathered, tuple(logit)


def _whole_batch(cached: list[Features], live: Features, j: int) -> Features:
    """The cached features of every micro-batch with micro-batch j's replaced by `live`."""
    parts = cached[:j] + [live] + cached[j + 1 :]
    return tuple(None if parts[0][k] is None else torch.cat([p[k] for p in parts]) for k in range(4))  # type: ignore[return-value]


def accumulate_gradients(model, micro_batches: list[dict], accelerator, loss: str = "clip") -> float:
    """Backward of the contrastive loss (`loss`: `clip` or `siglip`) of the batch made of
    `micro_batches` (on the model's device), into the parameters' `.grad`; returns that loss."""
    world, accum = accelerator.num_processes, len(micro_batches)
    cached: list[Features] = []
    if accum > 1:
        with torch.no_grad(), accelerator.autocast():
            cached = [_global_features(model, batch, accelerator, loss)[0] for batch in micro_batches]
    loss_value = 0.0
    for j, batch in enumerate(micro_batches):
        # DDP reduces the summed gradients once, after the last micro-batch; no_sync must hold
        # the forward too (DDP decides there), and the logit scale gets no gradient before.
        last = j == accum - 1
        with contextlib.nullcontext() if last else accelerator.no_sync(model):
            with accelerator.autocast():
                live, logit = _global_features(model, batch, accelerator, loss)
                if accum > 1:
                    live = _whole_batch(cached, live, j)
                    logit = logit if last else tuple(t.detach() for t in logit)
                value = (
                    siglip_loss(*live[:2], *logit, *live[2:])
                    if loss == "siglip"
                    else clip_loss(*live[:2], *logit, *live[2:])
                )
            # x world: DDP averages gradients, each process holds d(global loss)/d(own rows).
            accelerator.backward(value * world)
        loss_value = float(value.detach())
    return loss_value
