"""The papers' cross-encoders behind the backend interface: G, the ITM score of one image-caption
pair, as each reference computes it, one small adapter per family.

- BridgeTower: `logits[:, 1]` of `BridgeTowerForImageAndTextRetrieval`, the ITM head's logit for
  "match", as the COCO-Counterfactuals scoring script reads it (`logits[0, 1]`, one pair a call).
  Its contrastive head, `BridgeTowerForContrastiveLearning`, has no ITM score: its G is its
  contrastive logit, the learnt `logit_scale.exp()` times the cosine of the pair's `text_embeds`
  and `image_embeds`, a cell of the `logits_text_to_image` its forward computes for its loss
  (BridgeTower's own `compute_itc` scales its ITC similarity by its temperature likewise).
- ViLT: `logits[:, 0]` of `ViltForImageAndTextRetrieval` (its one logit), as that script reads it.
- BLIP: `itm_score[:, 1]` of `BlipForImageTextRetrieval(..., use_itm_head=True)`, the ITM head's
  logit for "match" before any softmax: BLIP's own retrieval evaluation
  (`train_retrieval.py: evaluation`, Li et al. 2022) ranks by `itm_head(...)[:, 1]` (plus the ITC
  similarity), not by the softmax its demo prints.
- FLAVA: `itm_logits[:, 1]` of `FlavaForPreTraining` (its ITM head; label 1 is "matched" in its
  pretraining), given the unmasked caption as `input_ids_masked` and no loss. Its contrastive
  model, `FlavaModel`, has no ITM head: its G is its contrastive logit, `logit_scale.exp()` times
  the cosine of the normalised `text_projection` and `image_projection` of its text and image
  [CLS] states, as `FlavaForPreTraining` computes `contrastive_logits_per_text` for its loss.

PN's s(x, y) (training/evaluation.py), a match score in [0, 1], is the ITM head's probability of
"match", the softmax of its two logits at the label G reads (`s_kind`; BLIP's demo prints exactly
this, `softmax(itm_output, dim=1)[:, 1]`); it comes from the same forward call as G (`score(...,
with_s=True)`); BridgeTower's contrastive head, with no ITM head, gives a dual encoder's, its
cosine mapped to [0, 1] as CLIP's is, and so does `FlavaModel`. ViLT has none: its one logit (`rank_output`) is trained by a softmax over a
positive and its sampled negatives (ViLT's `irtr` loss, Kim et al. 2021), so only differences
between captions' logits are defined, no probability of one pair.

A `CrossEncoderBackend` has what the report reads of a CLIP `Backend` (`module`, `model_id`,
`g_kind`, `dual_encoder`) and scores pairs (`score`): the model's own processor turns images and
captions into its inputs, so the inputs are exactly those of the model's reference call.
"""

from __future__ import annotations

import hashlib
import json
import logging

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from builders.models.clip_ids import ClipId
from builders.models.rgb import TransformersRGB

log = logging.getLogger(__name__)

#: How a cross-encoder with no dual encoder (ViLT, BridgeTower's ITM head) ranks: the top k of a
#: first-stage model re-ranked by its G (training/rerank.py; the MITL annotators, builders/eccv_positives/METHOD.md §2).
FIRST_STAGE_METHOD = "first_stage_top_k_reranked_by_itm"
#: PN's s of an embedding model (a dual encoder, a contrastive head): (cos + 1) / 2.
COSINE_S = "cosine_mapped_to_0_1"


class CrossEncoder(nn.Module):
    """forward(**inputs of the processor) -> G of each pair (one number a pair): column `column`
    of the ITM head's logits (`logits`)."""

    #: Which G: recorded with every ITM number, so deltas in different units are never compared.
    g_kind = ""
    #: Which s of PN (the module docstring): recorded with PN; "" where the head has none ...
    s_kind = ""
    #: ... and why, in the one line that refuses its PN (training/report/necessity.py).
    no_s = "its head gives no match probability s(x, y) in [0, 1]"
    column = 1

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def logits(self, **inputs) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, **inputs):
        return self.logits(**inputs)[:, self.column]

    def g_and_s(self, **inputs) -> torch.Tensor:
        """(pairs, 2): G and PN's s of one forward call (the module docstring)."""
        logits = self.logits(**inputs).float()
        return torch.stack([logits[:, self.column], logits.softmax(-1)[:, self.column]], 1)


class BlipItm(CrossEncoder):
    g_kind, s_kind = "blip_itm_logit", "blip_itm_match_probability"

    def logits(self, **inputs):
        return self.model(**inputs, use_itm_head=True).itm_score


class BridgeTowerItm(CrossEncoder):
    g_kind, s_kind = "bridgetower_itm_logit", "bridgetower_itm_match_probability"

    def logits(self, **inputs):
        return self.model(**inputs).logits


class ContrastiveHead(CrossEncoder):
    """A contrastive head with no ITM head: G its logit, the learnt logit scale times the cosine
    of the pair's normalised embeddings (`cosine`); s a dual encoder's, that cosine mapped to [0, 1]."""

    s_kind = COSINE_S

    def cosine(self, **inputs) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, **inputs):
        return self.model.logit_scale.exp() * self.cosine(**inputs)

    def g_and_s(self, **inputs) -> torch.Tensor:
        cos = self.cosine(**inputs).float()
        return torch.stack([self.model.logit_scale.exp().float() * cos, (cos + 1) / 2], 1)


class BridgeTowerItc(ContrastiveHead):
    g_kind = "bridgetower_itc_logit"

    def cosine(self, **inputs) -> torch.Tensor:
        # Its uni-modal towers never see the other modality: each row's embeddings are its own.
        out = self.model(**inputs)
        return (out.text_embeds * out.image_embeds).sum(-1)


class FlavaItc(ContrastiveHead):
    g_kind = "flava_itc_logit"

    def cosine(self, **inputs) -> torch.Tensor:
        # FlavaForPreTraining's global contrastive head, on FlavaModel's unimodal [CLS] states.
        out = self.model(**inputs, skip_multimodal_encoder=True)
        text = nn.functional.normalize(self.model.text_projection(out.text_embeddings[:, 0]), dim=-1)
        image = nn.functional.normalize(self.model.image_projection(out.image_embeddings[:, 0]), dim=-1)
        return (text * image).sum(-1)


class ViltItm(CrossEncoder):
    g_kind, column = "vilt_itm_logit", 0
    no_s = (
        "ViLT's ITM head has one logit (`rank_output`), trained by a softmax over a caption and its "
        "sampled negatives (ViLT's irtr loss), so it gives no match probability s(x, y) in [0, 1]"
    )

    def logits(self, **inputs):
        return self.model(**inputs).logits


class FlavaItm(CrossEncoder):
    g_kind, s_kind = "flava_itm_logit", "flava_itm_match_probability"

    def logits(self, **inputs):
        # The ITM head reads the multimodal encoding of `input_ids_masked`: the caption unmasked.
        return self.model(**inputs, input_ids_masked=inputs["input_ids"], return_loss=False).itm_logits


#: The scored head (the architecture in config.json, builders/models/families.py) -> its adapter.
ADAPTERS: dict[str, type[CrossEncoder]] = {
    "BlipForImageTextRetrieval": BlipItm,
    "BridgeTowerForImageAndTextRetrieval": BridgeTowerItm,
    "BridgeTowerForContrastiveLearning": BridgeTowerItc,
    "ViltForImageAndTextRetrieval": ViltItm,
    "FlavaForPreTraining": FlavaItm,
    "FlavaModel": FlavaItc,
}


class CrossEncoderBackend:
    """A cross-encoder as the report scores it: G per pair, no embeddings (no retrieval by
    embedding: `dual_encoder` is False). Built by `load_cross_encoder`."""

    dual_encoder = False

    def __init__(self, clip: ClipId, module: CrossEncoder, processor) -> None:
        self.clip, self.module, self.processor = clip, module, processor
        self.kind, self.model_id, self.g_kind, self.s_kind = clip.backend, clip.label, module.g_kind, module.s_kind

    def inputs(self, images: list, texts: list[str]) -> dict[str, torch.Tensor]:
        """The processor's inputs of the pairs (image i with text i), on the model's device.
        Images go in RGB as transformers' own conversion makes it (transparency over white): not
        every family's processor converts."""
        rgb = TransformersRGB()
        out = self.processor(
            images=[rgb(img) for img in images], text=texts, return_tensors="pt", padding=True, truncation=True
        )
        weight = next(self.module.parameters())
        # Pixels in the weights' dtype (a model loaded in fp16 or bf16); ids and masks stay integers.
        return {k: v.to(weight.device, weight.dtype if v.is_floating_point() else v.dtype) for k, v in out.items()}

    @torch.no_grad()
    def score(self, images: list, texts: list[str], with_s: bool = False) -> torch.Tensor:
        """G of each pair; `with_s`: (pairs, 2), G and s (`s_kind`) of one forward call."""
        if not with_s:
            return self.module(**self.inputs(images, texts)).float().cpu()
        return self.module.g_and_s(**self.inputs(images, texts)).cpu()


def load_cross_encoder(
    clip: ClipId, architecture: str, device: str = "cpu", dtype: str = "fp32"
) -> CrossEncoderBackend:
    """The cross-encoder `clip` names, scored by the head `architecture` (its config's), its
    weights loaded once in `dtype` on `device` (the caller owns both, as for a CLIP)."""
    from builders.models.loaders import load_image_text_model

    model, processor = load_image_text_model(clip.name, architecture, device=device, dtype=dtype)
    # In eval mode as a whole: the evaluation restores the mode it found (dropout stays off after it).
    return CrossEncoderBackend(clip, ADAPTERS[architecture](model).eval(), processor)


def preprocessing_digest(backend: CrossEncoderBackend, probe: list[str]) -> str:
    """sha256 of what turns a pair into the model's inputs, which the weights digest does not
    cover: the image processor's settings and the tokenizer's ids of `probe` captions."""
    tokens = backend.processor.tokenizer(probe, truncation=True)["input_ids"]
    desc = {"image_processor": backend.processor.image_processor.to_dict(), "tokens": tokens}
    return "sha256:" + hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()


def score_pairs(
    backend: CrossEncoderBackend, pairs: list[tuple], read, batch: int, desc: str, with_s: bool = False
) -> np.ndarray:
    """G of each (image key, caption) of `pairs`, in their order (`with_s`: (pairs, 2), G and s).
    The pairs are scored sorted by image key (stable), so a call of `batch` pairs decodes few
    images; `read(keys)` gives the images of a list of distinct keys. Progress with an ETA."""
    order = sorted(range(len(pairs)), key=lambda n: pairs[n][0])
    out = np.zeros((len(pairs), 2) if with_s else len(pairs), dtype=np.float32)
    with tqdm(total=len(order), desc=desc, unit="pair", leave=False) as bar:
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
            keys = list(dict.fromkeys(pairs[n][0] for n in chunk))
            images = dict(zip(keys, read(keys), strict=True))
            texts = [pairs[n][1] for n in chunk]
            out[chunk] = backend.score([images[pairs[n][0]] for n in chunk], texts, with_s).numpy()
            bar.update(len(chunk))
    return out


def counterfactual_pair_scores(backend: CrossEncoderBackend, images, captions: list[str], batch: int) -> np.ndarray:
    """(pairs, 3): G(C_c, I_c^s), G(C_c, I_o^s) and G(C_o, I_c^s) of each counterfactual pair,
    the three scores of IR_c and TR_c (`itm_inputs`). `images(rows)` gives the pair rows' decoded
    images, the original first (rows 2p and 2p + 1), as `captions` lists their captions; three
    forward pairs a counterfactual pair, `batch` forward pairs a call, with progress and an ETA."""
    pairs = len(captions) // 2
    per_call = max(1, batch // 3)
    out: list[np.ndarray] = []
    with tqdm(total=pairs, desc=f"ITM pairs of {backend.model_id}", unit="pair", leave=False) as bar:
        for start in range(0, pairs, per_call):
            chunk = range(start, min(start + per_call, pairs))
            decoded = images([r for p in chunk for r in (2 * p, 2 * p + 1)])
            img = [x for k in range(len(chunk)) for x in (decoded[2 * k + 1], decoded[2 * k], decoded[2 * k + 1])]
            cap = [x for p in chunk for x in (captions[2 * p + 1], captions[2 * p + 1], captions[2 * p])]
            out.append(backend.score(img, cap).numpy().reshape(-1, 3))
            bar.update(len(chunk))
    return np.concatenate(out).astype(np.float32) if out else np.zeros((0, 3), np.float32)
