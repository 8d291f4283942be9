"""The cross-encoders' finetuning objectives: a loss per family on the scoring adapter's own model
(builders/models/cross_encoders.py), so the module trained is the module scored.

BLIP (`--backend blip`, Li et al. 2022, BLIP's `train_retrieval.py` / `models/blip_retrieval.py`):

- ITC: image-text contrastive loss on the (gathered) batch, `image_feat @ text_feat.T / temp` with
  soft targets spread over the pairs of the same image (BLIP's `idx` mask: COCO's 5 captions of an
  image are all positives), `(loss_i2t + loss_t2i) / 2`. The features are transformers'
  `BlipForImageTextRetrieval(use_itm_head=False)`'s: `vision_proj` / `text_proj` of the [CLS]
  states of `vision_model` and the unimodal `text_encoder`.
- ITM: each image's positive caption plus one hard negative text per image and one hard negative
  image per text, sampled from the ITC similarities of the batch: `softmax(sim)` with the pairs
  of the same image zeroed, one draw per row by `torch.multinomial` (`sample_hard_negatives`),
  as `blip_retrieval.py` does; cross-entropy of `itm_head` over the B positive and 2B negative
  pairs (labels 1, 0), the head `use_itm_head=True` scores with.
- loss = ITC_WEIGHT x ITC + ITM_WEIGHT x ITM (BLIP's `loss_ita + loss_itm`: weights 1 and 1),
  each term's weight recorded in run.json and each term logged in loss.jsonl.

Left out, and why: BLIP's momentum encoder (a second, EMA copy of every weight) and its queue of
57,600 momentum features with momentum distillation (`alpha` 0.4): transformers'
`BlipForImageTextRetrieval` has neither (its saved class has no momentum weights or queue), and
the output must be a `save_pretrained` folder of that class; with them the ITC targets would mix
in the momentum model's soft similarities. The learnt temperature `temp` is not a weight of that
class either: the ITC uses BLIP's initial 0.07 (`BlipConfig.logit_scale_init_value` = ln(1/0.07)),
fixed. Hard negatives are drawn within each process's batch (BLIP's `negative_all_rank=False`
retrieval configs do the same on COCO; its Flickr config draws over all ranks); the ITC is over the
gathered batch (every process computes all of it, as the CLIP loss). The positive pair's text keeps the tokenizer's [CLS] (transformers' ITM scoring
does; BLIP's code swaps in its [ENC] token), so the pairs trained are the pairs scored.

BridgeTower (`--backend bridgetower`): `BridgeTowerForImageAndTextRetrieval` has only an ITM head
(no contrastive features), so its objective is ITM with in-batch hard negatives: the negatives are
sampled as BLIP's (same sampler) from the model's own match scores of every in-batch pair (the ITM
logit difference, a no-gradient pass over B x B pairs), then cross-entropy over B positive and 2B
negative pairs. See docs/training.md for what COCO-Counterfactuals publishes of its run.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from builders.engine.errors import UserFacingError
from builders.models.cross_encoders import BlipItm, BridgeTowerItm
from training.losses import gather_global

#: BLIP's `loss_ita + loss_itm`.
ITC_WEIGHT, ITM_WEIGHT = 1.0, 1.0


def seeded_generator(device, seed: int) -> torch.Generator:
    """A generator of its own for the negatives' draws: a function of (run seed, step, process), so
    a resumed run draws the negatives an uninterrupted one draws."""
    return torch.Generator(device=device).manual_seed(seed)


@torch.no_grad()
def sample_hard_negatives(
    sim: torch.Tensor, same: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(negative text of each image, negative image of each text): `sim` is image x text, `same`
    the pairs of one image (never drawn). BLIP's `weights_i2t = softmax(sim_i2t)` with the
    positives' weights zeroed, one `torch.multinomial` draw per row (and t2i on `sim.T`)."""
    w_i2t = F.softmax(sim.float(), dim=1).masked_fill(same, 0)
    w_t2i = F.softmax(sim.T.float(), dim=1).masked_fill(same.T, 0)
    if bool((w_i2t.sum(1) == 0).any() or (w_t2i.sum(1) == 0).any()):
        raise UserFacingError(
            "a training batch holds a single image, so it has no negative for image-text matching; "
            "raise --batch-size or add data with more images"
        )
    neg_image = torch.multinomial(w_t2i, 1, generator=generator).squeeze(1)
    neg_text = torch.multinomial(w_i2t, 1, generator=generator).squeeze(1)
    return neg_text, neg_image


def same_image(keys: torch.Tensor) -> torch.Tensor:
    """B x B: True where the two examples show the same image (BLIP's `idx` mask)."""
    return keys[:, None] == keys[None, :]


def soft_contrastive(sim: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
    """One direction of BLIP's ITC without distillation: cross-entropy of each row towards its
    same-image columns (uniformly), averaged over the rows."""
    targets = same.float() / same.float().sum(1, keepdim=True)
    return -(F.log_softmax(sim, dim=1) * targets).sum(1).mean()


def itm_pairs(n: int, neg_text: torch.Tensor, neg_image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(image index, text index) of the B positive, B negative-image and B negative-text pairs."""
    rows = torch.arange(n, device=neg_text.device)
    return torch.cat([rows, neg_image, rows]), torch.cat([rows, rows, neg_text])


def itm_labels(n: int, device) -> torch.Tensor:
    return torch.cat(
        [torch.ones(n, dtype=torch.long, device=device), torch.zeros(2 * n, dtype=torch.long, device=device)]
    )


class BlipRetrievalTraining(BlipItm):
    """BLIP's scorer (G: `itm_score[:, 1]`) that, given a training batch (`text=`), returns its
    (ITC, ITM) losses instead: one module, so DDP sees one forward per step."""

    objective = "blip_itc_itm"

    def is_image_param(self, name: str) -> bool:  # --lock-image
        return name.startswith(("model.vision_model.", "model.vision_proj."))

    def is_text_param(self, name: str) -> bool:  # --lock-text
        return name.startswith(("model.text_encoder.", "model.text_proj."))

    def forward(self, text=None, image_key=None, seed: int = 0, accelerator=None, **inputs):
        if text is None:
            return super().forward(**inputs)
        return self.losses(inputs["pixel_values"], text, image_key, seed, accelerator)

    def losses(self, pixel_values, text, image_key, seed: int, accelerator) -> torch.Tensor:
        m = self.model
        ids, mask = text["input_ids"], text["attention_mask"]
        image_embeds = m.vision_model(pixel_values=pixel_values).last_hidden_state
        text_embeds = m.text_encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        image_feat = F.normalize(m.vision_proj(image_embeds[:, 0, :]), dim=-1)
        text_feat = F.normalize(m.text_proj(text_embeds[:, 0, :]), dim=-1)
        scale = math.exp(m.config.logit_scale_init_value)  # 1 / BLIP's temp 0.07
        # The whole (gathered) batch's ITC on every process, ours live, as training/losses.py.
        same_all = same_image(gather_global(image_key, accelerator))
        sim = scale * gather_global(image_feat, accelerator) @ gather_global(text_feat, accelerator).T
        itc = (soft_contrastive(sim, same_all) + soft_contrastive(sim.T, same_all.T)) / 2
        local_sim = scale * image_feat @ text_feat.T
        neg_text, neg_image = sample_hard_negatives(
            local_sim.detach(), same_image(image_key), seeded_generator(local_sim.device, seed)
        )
        img, txt = itm_pairs(len(ids), neg_text, neg_image)
        fused = m.text_encoder(
            input_ids=ids[txt],
            attention_mask=mask[txt],
            encoder_hidden_states=image_embeds[img],
            encoder_attention_mask=torch.ones(image_embeds[img].shape[:-1], dtype=torch.long, device=ids.device),
        ).last_hidden_state
        itm = F.cross_entropy(m.itm_head(fused[:, 0, :]), itm_labels(len(ids), ids.device))
        return torch.stack([itc, itm])


class BridgeTowerRetrievalTraining(BridgeTowerItm):
    """BridgeTower's scorer (G: `logits[:, 1]`) that, given a training batch (`text=`), returns its
    ITM loss with in-batch hard negatives (module docstring)."""

    objective = "bridgetower_itm"

    def is_image_param(self, name: str) -> bool:  # --lock-image: the unimodal vision tower
        return name.startswith("model.bridgetower.vision_model.")

    def is_text_param(self, name: str) -> bool:  # --lock-text: the unimodal text tower
        return name.startswith("model.bridgetower.text_model.")

    def forward(self, text=None, image_key=None, seed: int = 0, accelerator=None, **inputs):
        if text is None:
            return super().forward(**inputs)
        return self.losses(inputs["pixel_values"], text, image_key, seed)

    def _logits(self, pixel_values, text, img, txt) -> torch.Tensor:
        mask = torch.ones(len(img), *pixel_values.shape[2:], dtype=torch.long, device=pixel_values.device)
        return self.model(
            input_ids=text["input_ids"][txt],
            attention_mask=text["attention_mask"][txt],
            pixel_values=pixel_values[img],
            pixel_mask=mask,
        ).logits

    def losses(self, pixel_values, text, image_key, seed: int) -> torch.Tensor:
        n = len(pixel_values)
        with torch.no_grad():  # every in-batch pair's match score: the sampler's similarities
            grid = torch.arange(n, device=pixel_values.device)
            img, txt = grid.repeat_interleave(n), grid.repeat(n)
            logits = self._logits(pixel_values, text, img, txt).float()
            sim = (logits[:, 1] - logits[:, 0]).view(n, n)
        neg_text, neg_image = sample_hard_negatives(
            sim, same_image(image_key), seeded_generator(pixel_values.device, seed)
        )
        img, txt = itm_pairs(n, neg_text, neg_image)
        itm = F.cross_entropy(self._logits(pixel_values, text, img, txt), itm_labels(n, pixel_values.device))
        return itm[None]


#: The objective's terms, in the order the module returns them, and each term's weight.
TERMS = {"blip_itc_itm": {"itc": ITC_WEIGHT, "itm": ITM_WEIGHT}, "bridgetower_itm": {"itm": 1.0}}
#: Terms of the whole gathered batch (every process computes all of it); the others are of the
#: process's own batch, which DDP's gradient average makes the batch's mean.
GLOBAL_TERMS = ("itc",)
#: The scored head (config.json's architecture) -> its training module.
TRAINABLE = {
    "BlipForImageTextRetrieval": BlipRetrievalTraining,
    "BridgeTowerForImageAndTextRetrieval": BridgeTowerRetrievalTraining,
}
