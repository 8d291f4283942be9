"""The real architectures of the papers' cross-encoders (builders/models/families.py), written down
as public facts like `production_configs` (which holds the CLIPs'), so `counterfactory doctor`
instantiates each at its published size with random weights and no download:

- BLIP ITM base and large (`Salesforce/blip-itm-base-coco`, `-large-coco`): ViT-B/16 or ViT-L/16
  at 384 px + a BERT-base text encoder with cross-attention to the image (Li et al. 2022, §3.1;
  the released `configs/retrieval_coco.yaml`: image_size 384, `vit: base|large`);
- BridgeTower large ITM (`BridgeTower/bridgetower-large-itm-mlm`): CLIP ViT-L/14 at 294 px +
  RoBERTa-large + 6 cross-modal layers of width 1024 (Xu et al. AAAI 2023, §4.1); its contrastive
  head (`BridgeTower/bridgetower-large-itm-mlm-itc`, the COCO-Counterfactuals paper's) on the same
  towers, with ITC projections to 512;
- ViLT (`dandelin/vilt-b32-finetuned-coco`): one ViT-B/32 over word and patch embeddings, 384 px
  shorter side (Kim et al. ICML 2021, §3);
- FLAVA (`facebook/flava-full`): ViT-B/16 image and text encoders, a 6-layer multimodal encoder
  and the DALL-E codebook its pretraining heads use (Singh et al. CVPR 2022, §3); its contrastive
  model (`FlavaModel`) is the same towers and projections without the pretraining heads and codebook.

Each config is the architecture fields of the checkpoint's `config.json` on the Hub (cited per
entry); where transformers' default config is documented as that checkpoint's (ViLT's defaults
are `dandelin/vilt-b32-mlm`'s, whose architecture the COCO finetune keeps; FLAVA's are
`facebook/flava-full`'s), the entry says so. No paper or card states the whole models' counts
offline, so `published_params` stays 0: tests/models/test_production_families.py checks each
count against the layer arithmetic of its config, written out there, and the towers that have a
published size against it (ViT-B 86M, ViT-L 307M, RoBERTa-large 355M).
"""

from __future__ import annotations

from builders.models.production_configs import BLIP_BASE, ProductionArch

#: Each arch's `family` is the transformers class of the head `--model` scores (its config's
#: `architectures`, builders/models/families.py), which `build_empty` instantiates.
BLIP_ITM, BRIDGETOWER_ITM, BRIDGETOWER_ITC, VILT_ITM, FLAVA_PRETRAINING, FLAVA_ITC = (
    "BlipForImageTextRetrieval",
    "BridgeTowerForImageAndTextRetrieval",
    "BridgeTowerForContrastiveLearning",
    "ViltForImageAndTextRetrieval",
    "FlavaForPreTraining",
    "FlavaModel",
)

# Salesforce/blip-itm-base-coco config.json: the captioner's towers (`production_configs.BLIP_BASE`:
# ViT-B/16 at 384 px, 577 positions; BERT-base cross-attending to the image, BLIP's
# `med_config.json`) with ITC projections to 256 (`image_text_hidden_size`, BLIP's `embed_dim`).
BLIP_ITM_BASE = {
    "image_text_hidden_size": 256,
    "text_config": BLIP_BASE["text_config"],
    "vision_config": BLIP_BASE["vision_config"],
}
# Salesforce/blip-itm-large-coco config.json: ViT-L/16 at 384 px; the text encoder stays BERT-base
# and cross-attends to 1024-wide image tokens.
BLIP_ITM_LARGE = {
    "image_text_hidden_size": 256,
    "text_config": {**BLIP_BASE["text_config"], "encoder_hidden_size": 1024},
    "vision_config": {
        **BLIP_ITM_BASE["vision_config"],
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
    },
}
# BridgeTower/bridgetower-large-itm-mlm config.json: RoBERTa-large text tower, CLIP ViT-L/14 at
# 294 px, 6 cross-modal layers of width 1024 (16 heads) with a link tower ("add") per layer.
BRIDGETOWER_LARGE = {
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_hidden_layers": 6,
    "share_cross_modal_transformer_layers": True,
    "share_link_tower_layers": False,
    "link_tower_type": "add",
    "text_config": {
        "vocab_size": 50265,
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "max_position_embeddings": 514,
        "type_vocab_size": 1,
        "pad_token_id": 1,
    },
    "vision_config": {"hidden_size": 1024, "num_hidden_layers": 24, "patch_size": 14, "image_size": 294},
}
# BridgeTower/bridgetower-large-itm-mlm-itc config.json: the same towers, ITC heads to 512, logit
# scale initialised at 2.6592 (log 1/0.07).
BRIDGETOWER_LARGE_ITC = {**BRIDGETOWER_LARGE, "contrastive_hidden_size": 512, "logit_scale_init_value": 2.6592}
# dandelin/vilt-b32-finetuned-coco config.json: transformers' ViltConfig defaults (documented as
# dandelin/vilt-b32-mlm's, the checkpoint the COCO retrieval model is finetuned from).
VILT_B32 = {
    "vocab_size": 30522,
    "type_vocab_size": 2,
    "modality_type_vocab_size": 2,
    "max_position_embeddings": 40,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "image_size": 384,
    "patch_size": 32,
}
# facebook/flava-full config.json: transformers' FlavaConfig defaults, documented as this
# checkpoint's (ViT-B/16 image and text encoders, 6 multimodal layers, projections to 768, the
# DALL-E encoder as image codebook: 8192 codes, 4 groups of 2 blocks, 256 wide, 112 px).
_FLAVA_B16 = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12}
FLAVA_FULL = {
    "hidden_size": 768,
    "projection_dim": 768,
    "image_config": {**_FLAVA_B16, "image_size": 224, "patch_size": 16},
    "text_config": {**_FLAVA_B16, "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2},
    "multimodal_config": {**_FLAVA_B16, "num_hidden_layers": 6},
    "image_codebook_config": {"hidden_size": 256, "num_groups": 4, "num_blocks_per_group": 2, "vocab_size": 8192},
}

FAMILY_ARCHS: tuple[ProductionArch, ...] = (
    ProductionArch(
        "blip_itm_base",
        "Salesforce/blip-itm-base-coco",
        BLIP_ITM,
        BLIP_ITM_BASE,
        source="Salesforce/blip-itm-base-coco config.json (BLIP configs/retrieval_coco.yaml, vit: base)",
    ),
    ProductionArch(
        "blip_itm_large",
        "Salesforce/blip-itm-large-coco",
        BLIP_ITM,
        BLIP_ITM_LARGE,
        source="Salesforce/blip-itm-large-coco config.json (BLIP configs/retrieval_coco.yaml, vit: large)",
    ),
    ProductionArch(
        "bridgetower_large_itm",
        "BridgeTower/bridgetower-large-itm-mlm",
        BRIDGETOWER_ITM,
        BRIDGETOWER_LARGE,
        source="BridgeTower/bridgetower-large-itm-mlm config.json (BridgeTower paper §4.1: "
        "CLIP ViT-L/14, RoBERTa-large, 294 px)",
    ),
    ProductionArch(
        "bridgetower_large_itc",
        "BridgeTower/bridgetower-large-itm-mlm-itc",
        BRIDGETOWER_ITC,
        BRIDGETOWER_LARGE_ITC,
        source="BridgeTower/bridgetower-large-itm-mlm-itc config.json (contrastive_hidden_size 512)",
    ),
    ProductionArch(
        "vilt_coco",
        "dandelin/vilt-b32-finetuned-coco",
        VILT_ITM,
        VILT_B32,
        source="dandelin/vilt-b32-finetuned-coco config.json (transformers' ViltConfig defaults)",
    ),
    ProductionArch(
        "flava_full",
        "facebook/flava-full",
        FLAVA_PRETRAINING,
        FLAVA_FULL,
        source="facebook/flava-full config.json (transformers' FlavaConfig defaults)",
    ),
    ProductionArch(
        "flava_full_itc",
        "facebook/flava-full",
        FLAVA_ITC,
        FLAVA_FULL,
        source="facebook/flava-full config.json (transformers' FlavaConfig defaults), as FlavaModel",
    ),
)
FAMILY_ARCH = {arch.name: arch for arch in FAMILY_ARCHS}
