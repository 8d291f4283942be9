"""Contrastive losses on the global batch: `--loss clip` (softmax) and `--loss siglip` (sigmoid).

Symmetric InfoNCE (CLIP): logits = scale x image @ text^T over the *global* batch, cross-entropy
towards the diagonal in both directions, averaged.

Sigmoid loss (SigLIP, Zhai et al. 2023, as open_clip's `loss.SigLipLoss`): logits = scale x
image @ text^T + bias; every (image, text) cell is its own binary problem, label +1 on the
diagonal and -1 elsewhere; loss = -sum(log sigmoid(label x logit)) / images. open_clip sums each
process's images against every process's texts and DDP averages, which is this loss of the global
batch. A model with a `logit_bias` (SigLIP) was trained with it, so `--loss` follows the model
(`resolve_loss`): the other choice is refused, never applied silently.

`--hard-negatives negclip` (NegCLIP, Yuksekgonul et al. 2023): each row's counterfactual caption is
an extra text *column* of the image->text logits only; rows without one get a masked column (-inf
under the softmax; left out of the sigmoid's sum). The text->image direction is unchanged.
`--hard-negatives pairs` changes no loss: it puts both rows of a pair in the same batch
(training/data.py), so each is the other's in-batch negative.

Features of the other processes are gathered without gradient and the local features put back
in their place, so every process computes the loss of the whole global batch; the gradient that
reaches a process is then d(loss)/d(its own features), and the trainer multiplies the loss by
the process count before backward because DDP averages gradients over processes. The result
equals the single-process gradient of the same global batch. Processes may hold different row
counts (the kept last batch of an epoch, `--last-batch keep`): each one's rows are padded for the
gather and cut back after it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from builders.engine.errors import UserFacingError

LOSSES = ("clip", "siglip")


def resolve_loss(asked: str | None, has_logit_bias: bool, model_id: str) -> str:
    """`--loss` as the model was trained: `siglip` for a model with a logit bias, else `clip`;
    `None` picks it, the other choice is one line."""
    fits = "siglip" if has_logit_bias else "clip"
    if asked is not None and asked != fits:
        kind = (
            "has a logit_bias (a SigLIP model, trained with the sigmoid loss)"
            if has_logit_bias
            else "has no logit_bias (a CLIP model, trained with the softmax loss)"
        )
        raise UserFacingError(
            f"--loss {asked} does not fit --model {model_id}: it {kind}; give --loss {fits} or leave --loss out"
        )
    return fits


def gather_global(local: torch.Tensor, accelerator) -> torch.Tensor:
    """Concatenate `local` over processes in rank order, keeping the autograd graph of ours."""
    if accelerator is None or accelerator.num_processes == 1:
        return local
    sizes = accelerator.gather(torch.tensor([len(local)], device=local.device)).tolist()
    longest = max(sizes)
    padded = local.detach()
    if len(local) < longest:
        padded = torch.cat([padded, padded.new_zeros(longest - len(local), *local.shape[1:])])
    gathered = accelerator.gather(padded).view(accelerator.num_processes, longest, *local.shape[1:])
    parts = [rows[:n] for rows, n in zip(gathered.unbind(0), sizes, strict=True)]
    parts[accelerator.process_index] = local
    return torch.cat(parts, dim=0)


def clip_loss(
    image: torch.Tensor,
    text: torch.Tensor,
    scale: torch.Tensor,
    negative: torch.Tensor | None = None,
    negative_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Symmetric InfoNCE over aligned rows; with `negative`, NegCLIP's extra i2t columns."""
    labels = torch.arange(len(image), device=image.device)
    logits_i2t = scale * image @ text.T
    logits_t2i = logits_i2t.T
    if negative is not None:
        extra = scale * image @ negative.T
        extra = extra.masked_fill(~negative_mask.bool()[None, :], float("-inf"))
        logits_i2t = torch.cat([logits_i2t, extra], dim=1)
    return (F.cross_entropy(logits_i2t, labels) + F.cross_entropy(logits_t2i, labels)) / 2


def siglip_loss(
    image: torch.Tensor,
    text: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor,
    negative: torch.Tensor | None = None,
    negative_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """SigLIP's sigmoid loss over aligned rows; with `negative`, every unmasked negative caption
    is one more negative (label -1) of every image."""
    logits = scale * image @ text.T + bias
    labels = 2 * torch.eye(len(image), device=image.device, dtype=logits.dtype) - 1
    total = -F.logsigmoid(labels * logits).sum()
    if negative is not None:
        extra = scale * image @ negative[negative_mask.bool()].T + bias
        total = total - F.logsigmoid(-extra).sum()
    return total / len(image)


def contrastive_loss(
    kind: str,
    image: torch.Tensor,
    text: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    negative: torch.Tensor | None = None,
    negative_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The `--loss` of the batch (`bias` is the SigLIP model's logit bias)."""
    if kind == "siglip":
        return siglip_loss(image, text, scale, bias, negative, negative_mask)
    return clip_loss(image, text, scale, negative, negative_mask)
