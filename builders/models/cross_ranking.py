"""How each cross-encoder family ranks retrieval, as its own paper does: the one copy shared by
`counterfactory benchmark` and the trainer's evaluation (training/rerank.py) and the MITL
annotators (builders/eccv_positives/mitl/cross_annotators.py).

- BLIP (`BlipForImageTextRetrieval`): its ITC similarity (the cosine of its projected [CLS]
  features, the model's `use_itm_head=False` output) picks each query's top k, which are ranked by
  ITM logit + ITC similarity, as BLIP's released evaluation adds them (salesforce/BLIP
  `train_retrieval.py`, `evaluation`: `score_matrix_i2t[i, topk_idx] = itm_head(...)[:, 1] +
  topk_sim`, and likewise t2i); k = 256, its COCO config's `k_test` (`configs/retrieval_coco.yaml`).
- FLAVA (`FlavaForPreTraining`): zero-shot retrieval by its contrastive embeddings alone (the
  cosine of the projected image and text [CLS] states), as FLAVA's paper (Singh et al. 2022,
  zero-shot retrieval) and its released example (facebookresearch/multimodal
  `examples/flava/coco_zero_shot.py`) rank; no ITM re-ranking, so k is 0. Its contrastive model
  (`FlavaModel`) ranks by the same projections, read from itself rather than `.flava`.
- BridgeTower's contrastive head (`BridgeTowerForContrastiveLearning`): by its contrastive
  embeddings alone (its forward's normalised `text_embeds` and `image_embeds`, whose cosines
  times its logit scale are the `logits_text_to_image` it trains on), k 0, as the
  COCO-Counterfactuals paper's zero-shot retrieval with `bridgetower-large-itm-mlm-itc` is read
  here (it does not say whether it re-ranked).
- Any other cross-encoder (ViLT, BridgeTower's ITM head) has no dual encoder: it re-ranks the top
  k of a first-stage model by its G (`FIRST_STAGE_METHOD`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from builders.engine.errors import UserFacingError
from builders.models.cross_encoders import FIRST_STAGE_METHOD
from builders.models.families import ModelFamily
from builders.models.rgb import TransformersRGB

#: architecture -> how it ranks (the records' `retrieval.method`).
BLIP_METHOD = "itc_top_k_reranked_by_itm_plus_itc"
CONTRASTIVE_METHOD = "contrastive"
OWN_FIRST_STAGE = {
    "BlipForImageTextRetrieval": BLIP_METHOD,
    "FlavaForPreTraining": CONTRASTIVE_METHOD,
    "FlavaModel": CONTRASTIVE_METHOD,
    "BridgeTowerForContrastiveLearning": CONTRASTIVE_METHOD,
}


def method_of(architecture: str) -> str:
    return OWN_FIRST_STAGE.get(architecture, FIRST_STAGE_METHOD)


def check_first_stage(name: str, found: ModelFamily) -> None:
    """`--first-stage name` (of family `found`) for the benchmark, the trainer and the MITL
    annotators: a model whose embeddings pick the candidates (a CLIP, or a cross-encoder's own
    contrastive head: BLIP, FLAVA, BridgeTower's), or one line."""
    if not (found.dual_encoder or found.architecture in OWN_FIRST_STAGE):
        raise UserFacingError(
            f"--first-stage {name[:200]!r} is a {found.family.name} cross-encoder without embeddings; "
            "give a CLIP or a model with contrastive embeddings (BLIP, FLAVA, BridgeTowerForContrastiveLearning)"
        )


def reranked_scores(method: str, g: np.ndarray, itc: np.ndarray) -> np.ndarray:
    """The score a re-ranked candidate is ranked by: G, plus its ITC similarity for BLIP (see the
    module docstring)."""
    return g + itc if method == BLIP_METHOD else g


@torch.no_grad()
def itc_images(backend, images: list) -> torch.Tensor:
    """BLIP's, FLAVA's or BridgeTower's normalised contrastive image features (see the module
    docstring)."""
    model, rgb = backend.module.model, TransformersRGB()
    if hasattr(model, "itc_image_head"):  # BridgeTower's forward needs captions: any will do
        return _bridgetower_itc(backend, images, [""] * len(images)).image_embeds.float().cpu()
    px = backend.processor.image_processor(images=[rgb(i) for i in images], return_tensors="pt")["pixel_values"]
    weight = next(model.parameters())
    px = px.to(weight.device, weight.dtype)  # pixels in the weights' dtype (fp16 or bf16 on a GPU)
    flava = getattr(model, "flava", model)  # FlavaForPreTraining wraps a FlavaModel; FlavaModel is one
    if hasattr(flava, "image_projection"):
        feats = flava.image_projection(flava.image_model(pixel_values=px).last_hidden_state[:, 0])
    else:
        feats = model.vision_proj(model.vision_model(pixel_values=px).last_hidden_state[:, 0])
    return F.normalize(feats.float(), dim=-1).cpu()


@torch.no_grad()
def itc_texts(backend, texts: list[str]) -> torch.Tensor:
    """BLIP's, FLAVA's or BridgeTower's normalised contrastive text features."""
    model = backend.module.model
    if hasattr(model, "itc_text_head"):
        from PIL import Image

        return _bridgetower_itc(backend, [Image.new("RGB", (8, 8))] * len(texts), texts).text_embeds.float().cpu()
    tok = backend.processor.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    tok = {k: v.to(next(model.parameters()).device) for k, v in tok.items()}
    flava = getattr(model, "flava", model)
    if hasattr(flava, "text_projection"):
        feats = flava.text_projection(flava.text_model(**tok).last_hidden_state[:, 0])
    else:
        out = model.text_encoder(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"])
        feats = model.text_proj(out.last_hidden_state[:, 0])
    return F.normalize(feats.float(), dim=-1).cpu()


def _bridgetower_itc(backend, images: list, texts: list[str]):
    """`BridgeTowerForContrastiveLearning`'s own output on the pairs: it has no text-only or
    image-only call, but its uni-modal towers never see the other modality, so each row's
    `text_embeds` depend on its caption alone and its `image_embeds` on its image alone (the
    placeholder partners cost a forward pass, not a change)."""
    return backend.module.model(**backend.inputs(images, texts))


class ItcScorer:
    """A BLIP's, FLAVA's or BridgeTower's contrastive head as an embedding annotator scores (`images`, `texts`:
    normalised features, as builders/models/clip.py's scorers give them)."""

    def __init__(self, backend) -> None:
        self.backend = backend

    def images(self, images: list) -> torch.Tensor:
        return itc_images(self.backend, images)

    def texts(self, texts: list[str]) -> torch.Tensor:
        return itc_texts(self.backend, texts)
