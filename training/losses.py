"""Contrastive losses on the global batch.

Symmetric InfoNCE (CLIP): logits = scale x image @ text^T over the *global* batch, cross-entropy
towards the diagonal in both directions, averaged.

`--hard-negatives negclip` (NegCLIP, Yuksekgonul et al. 2023): each row's counterfactual caption is
an extra text *column* of the image->text logits only; rows without one get a masked (-inf)
column. The text->image direction is unchanged. `--hard-negatives pairs` changes no loss: it puts
both rows of a pair in the same batch (training/data.py), so each is the other's in-batch
negative.

Features of the other processes are gathered without gradient and the local features put back
in their place, so every process computes the loss of the whole global batch; the gradient that
reaches a process is then d(loss)/d(its own features), and the trainer multiplies the loss by
the process count before backward because DDP averages gradients over processes. The result
equals the single-process gradient of the same global batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gather_global(local: torch.Tensor, accelerator) -> torch.Tensor:
    """Concatenate `local` over processes in rank order, keeping the autograd graph of ours."""
    if accelerator is None or accelerator.num_processes == 1:
        return local
    gathered = accelerator.gather(local.detach()).view(accelerator.num_processes, *local.shape)
    parts = list(gathered.unbind(0))
    parts[accelerator.process_index] = local
    return torch.cat(parts, dim=0)


def clip_loss(image: torch.Tensor, text: torch.Tensor, scale: torch.Tensor,
              negative: torch.Tensor | None = None,
              negative_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Symmetric InfoNCE over aligned rows; with `negative`, NegCLIP's extra i2t columns."""
    labels = torch.arange(len(image), device=image.device)
    logits_i2t = scale * image @ text.T
    logits_t2i = logits_i2t.T
    if negative is not None:
        extra = scale * image @ negative.T
        extra = extra.masked_fill(~negative_mask.bool()[None, :], float("-inf"))
        logits_i2t = torch.cat([logits_i2t, extra], dim=1)
    return (F.cross_entropy(logits_i2t, labels) + F.cross_entropy(logits_t2i, labels)) / 2
