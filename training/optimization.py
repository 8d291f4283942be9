"""The optimizer's parameter groups and the logit-scale clamp, as the reference CLIP trainers do.

- Weight decay applies to the weight matrices only: biases (any parameter named `*bias`), the
  weights of normalisation layers (LayerNorm and the like) and the temperature `logit_scale`
  (and SigLIP's `logit_bias`) are in a group without decay. Hugging Face's Trainer
  (`Trainer.get_decay_parameter_names`, which run_clip.py uses) excludes biases and LayerNorm
  weights; open_clip's `open_clip_train/main.py` excludes biases, norms and `logit_scale` (its
  `exclude` rule). Decaying the temperature would pull it toward exp(0) = 1, i.e. flatten every
  softmax.
- With the open_clip backend every other 1-D parameter is left undecayed too (the class token
  `visual.class_embedding`, ...), as open_clip's own trainer does: `open_clip_train/main.py`
  (open_clip 3.3.0) excludes `p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n or
  "logit_scale" in n`. The transformers backend keeps Hugging Face's rule, which decays them.
- Adam's `betas` and `eps` are `--beta1 --beta2 --eps` (defaults 0.9, 0.999, 1e-8: torch's and
  transformers' `TrainingArguments`; open_clip_train's `get_default_params` takes 0.9, 0.98, 1e-6
  for ViTs, from the CLIP paper), set per recipe (training/config.py).
- After every optimizer step `logit_scale` (a log temperature) is clamped to [0, ln 100]: CLIP
  (Radford et al. 2021 §2.5, "clipped to prevent scaling the logits by more than 100") and
  open_clip (`unwrap_model(model).logit_scale.clamp_(0, math.log(100))` after each step).
"""

from __future__ import annotations

import math

import torch
from torch import nn

#: Parameter names (last component) that never decay: the contrastive temperature and bias.
NO_DECAY_NAMES = ("logit_scale", "logit_bias")
#: Normalisation layers whose weights never decay.
NORM_LAYERS = (
    nn.LayerNorm,
    nn.GroupNorm,
    nn.modules.batchnorm._NormBase,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)
#: CLIP's bound of the logit scale (exp(ln 100) = 100).
MAX_LOGIT_SCALE = math.log(100)


def no_decay_names(module: nn.Module, one_dimensional: bool = False) -> set[str]:
    """Names (as `module.named_parameters()` gives them) of the parameters without weight decay:
    biases, normalisation-layer weights and the logit scale / bias; with `one_dimensional`
    (open_clip's rule) every parameter of fewer than 2 dimensions as well."""
    out: set[str] = set()
    for prefix, sub in module.named_modules():
        for name, p in sub.named_parameters(recurse=False):
            full = f"{prefix}.{name}" if prefix else name
            # `"bias" in name`: also nn.MultiheadAttention's in_proj_bias (open_clip's towers).
            if (
                "bias" in name
                or name in NO_DECAY_NAMES
                or isinstance(sub, NORM_LAYERS)
                or (one_dimensional and p.ndim < 2)
            ):
                out.add(full)
    return out


def param_groups(module: nn.Module, weight_decay: float, one_dimensional: bool = False) -> list[dict]:
    """The trainable parameters in two optimizer groups: with `weight_decay` and without."""
    skip = no_decay_names(module, one_dimensional)
    decay, no_decay = [], []
    for name, p in module.named_parameters():
        if p.requires_grad:
            (no_decay if name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(
    module: nn.Module,
    optimizer: str,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    one_dimensional: bool = False,
) -> torch.optim.Optimizer:
    """Adam or AdamW over `param_groups` (`one_dimensional`: open_clip's no-decay rule)."""
    cls = torch.optim.Adam if optimizer == "adam" else torch.optim.AdamW
    return cls(param_groups(module, weight_decay, one_dimensional), lr=lr, betas=betas, eps=eps)


@torch.no_grad()
def clamp_logit_scale(module: nn.Module) -> None:
    """Clamp every `logit_scale` parameter of `module` to [0, ln 100] in place."""
    for name, p in module.named_parameters():
        if name.rsplit(".", 1)[-1] == "logit_scale":
            p.clamp_(0, MAX_LOGIT_SCALE)
