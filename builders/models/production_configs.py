"""The real architectures of the production models (`profiles.PRODUCTION`), written down as
public facts so they can be instantiated at their real size without downloading anything.

CI only ever loads the tiny stand-ins of `builders.models.tiny`, whose layer counts, widths and
attention layouts differ from the real ones. `build_empty(arch)` builds a production model on
the meta device (shapes, no weight memory, no compute), so the shape-dependent code paths — the
Prompt-to-Prompt processors and their `--inject` layer selection, the 9-channel inpainting UNet,
the CLIP projection widths the scorer compares — are checked at the production shapes
(tests/models/test_production_shapes.py). The image stage's other generators (SDXL, SD3, FLUX) are in
`builders.models.production_generators`, the papers' cross-encoders (BLIP, BridgeTower, ViLT,
FLAVA) in `builders.models.production_families`, built by the same `build_empty`.

Each config is copied from the model's `config.json` on the Hub (cited per entry), architecture
fields only: dropout and init settings do not change shapes. `published_params` is the count
the model card or paper states, with the precision it states it at; `tolerance` is the relative
difference allowed against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

UNET, VAE, CLIP_TEXT, CLIP, OPEN_CLIP, MLM, CAUSAL_LM, BERT, BLIP = (
    "unet",
    "vae",
    "clip_text",
    "clip",
    "open_clip",
    "mlm",
    "causal_lm",
    "bert",
    "blip",
)
# The generators' families (their configs: builders/models/production_generators.py).
CLIP_TEXT_PROJ, T5_ENCODER, SD3_TRANSFORMER, FLUX_TRANSFORMER = (
    "clip_text_projection",
    "t5_encoder",
    "sd3_transformer",
    "flux_transformer",
)


@dataclass(frozen=True)
class ProductionArch:
    """One production model (or pipeline component) at its real size."""

    #: `<profile role>` or `<profile role>.<pipeline component>` (e.g. `sd.unet`).
    name: str
    #: The Hub id of `profiles.PRODUCTION` it stands for.
    model_id: str
    #: Which constructor `build_empty` uses (one of the family constants above).
    family: str
    config: dict[str, Any] = field(hash=False)
    published_params: float = 0.0
    tolerance: float = 0.005
    #: Where the config and the published count come from.
    source: str = ""
    #: The published count is the checkpoint's tensor count, which stores a copy of the tied
    #: input/output embeddings (BLIP's LM head): count tied parameters once per use.
    counts_tied_copies: bool = False


_SD = "stable-diffusion-v1-5/stable-diffusion-v1-5"
_SD_INPAINT = "stable-diffusion-v1-5/stable-diffusion-inpainting"

# stable-diffusion-v1-5 unet/config.json (CompVis v1 architecture, unchanged since v1-1).
SD_UNET = {
    "sample_size": 64,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
    "up_block_types": ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3,
    "block_out_channels": [320, 640, 1280, 1280],
    "layers_per_block": 2,
    "attention_head_dim": 8,
    "cross_attention_dim": 768,
    "norm_num_groups": 32,
    "norm_eps": 1e-5,
    "act_fn": "silu",
    "downsample_padding": 1,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "center_input_sample": False,
    "mid_block_scale_factor": 1,
}
# stable-diffusion-inpainting unet/config.json: the same UNet, 4 latent + 1 mask + 4 masked-image
# latent input channels.
SD_INPAINT_UNET = {**SD_UNET, "in_channels": 9}
# stable-diffusion-v1-5 vae/config.json (AutoencoderKL, downsampling factor 8).
SD_VAE = {
    "sample_size": 512,
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 4,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [128, 256, 512, 512],
    "layers_per_block": 2,
    "norm_num_groups": 32,
    "act_fn": "silu",
    "scaling_factor": 0.18215,
}
# openai/clip-vit-large-patch14 config.json; SD v1.5's text_encoder/config.json is its text tower.
CLIP_L14_TEXT = {
    "vocab_size": 49408,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
    "projection_dim": 768,
    "bos_token_id": 49406,
    "eos_token_id": 49407,
    "pad_token_id": 1,
}
CLIP_L14 = {
    "projection_dim": 768,
    "text_config": CLIP_L14_TEXT,
    "vision_config": {
        "image_size": 224,
        "patch_size": 14,
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "hidden_act": "quick_gelu",
        "projection_dim": 768,
    },
}
# openai/clip-vit-base-patch32 config.json.
CLIP_B32 = {
    "projection_dim": 512,
    "text_config": {
        **CLIP_L14_TEXT,
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_attention_heads": 8,
        "projection_dim": 512,
    },
    "vision_config": {
        "image_size": 224,
        "patch_size": 32,
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "hidden_act": "quick_gelu",
        "projection_dim": 512,
    },
}
# timm/vit_base_patch32_clip_224.openai open_clip_config.json `model_cfg` (open_clip's ViT-B-32
# with the OpenAI weights' QuickGELU).
OPEN_CLIP_B32 = {
    "embed_dim": 512,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 224, "layers": 12, "width": 768, "patch_size": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 512, "heads": 8, "layers": 12},
}
# FacebookAI/roberta-base config.json.
ROBERTA_BASE = {
    "vocab_size": 50265,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 514,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-5,
    "bos_token_id": 0,
    "pad_token_id": 1,
    "eos_token_id": 2,
}
# openai-community/gpt2-large config.json.
GPT2_LARGE = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 1280, "n_layer": 36, "n_head": 20}
# sentence-transformers/all-MiniLM-L6-v2 config.json (a BERT; mean pooling adds no weights).
MINILM_L6 = {
    "vocab_size": 30522,
    "hidden_size": 384,
    "intermediate_size": 1536,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
}
# Salesforce/blip-image-captioning-base config.json (ViT-B/16 at 384 px + BERT-base decoder).
BLIP_BASE = {
    "projection_dim": 512,
    "image_text_hidden_size": 256,
    "text_config": {
        "vocab_size": 30524,
        "hidden_size": 768,
        "encoder_hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "max_position_embeddings": 512,
        "bos_token_id": 30522,
        "sep_token_id": 102,
        "pad_token_id": 0,
    },
    "vision_config": {
        "image_size": 384,
        "patch_size": 16,
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "layer_norm_eps": 1e-5,
    },
}

PRODUCTION_ARCHS: tuple[ProductionArch, ...] = (
    ProductionArch(
        "sd.unet", _SD, UNET, SD_UNET, 859.52e6, 0.001, "SD v1.5 model card / unet config.json; 859,520,964 parameters"
    ),
    ProductionArch(
        "sd.vae", _SD, VAE, SD_VAE, 83.65e6, 0.001, "SD v1.5 vae/config.json; AutoencoderKL 83,653,863 parameters"
    ),
    ProductionArch(
        "sd.text_encoder",
        _SD,
        CLIP_TEXT,
        CLIP_L14_TEXT,
        123.06e6,
        0.001,
        "SD v1.5 model card (CLIP ViT-L/14 text encoder, 123M) / text_encoder/config.json",
    ),
    ProductionArch(
        "sd_inpaint.unet",
        _SD_INPAINT,
        UNET,
        SD_INPAINT_UNET,
        859.54e6,
        0.001,
        "SD inpainting model card / unet config.json: SD v1.5's UNet with 9 input "
        "channels (+5 x 320 x 3 x 3 conv_in weights)",
    ),
    ProductionArch(
        "clip_filter",
        "openai/clip-vit-large-patch14",
        CLIP,
        CLIP_L14,
        427.6e6,
        0.001,
        "openai/clip-vit-large-patch14 config.json; Hub: 428M (427,616,513)",
    ),
    ProductionArch(
        "clip",
        "openai/clip-vit-base-patch32",
        CLIP,
        CLIP_B32,
        151.28e6,
        0.001,
        "openai/clip-vit-base-patch32 config.json; Hub: 151M (151,277,313)",
    ),
    ProductionArch(
        "open_clip",
        "hf-hub:timm/vit_base_patch32_clip_224.openai",
        OPEN_CLIP,
        OPEN_CLIP_B32,
        151.28e6,
        0.001,
        "open_clip model_configs/ViT-B-32.json; open_clip model profile table: 151.28M",
    ),
    ProductionArch(
        "mlm",
        "FacebookAI/roberta-base",
        MLM,
        ROBERTA_BASE,
        125e6,
        0.005,
        "FacebookAI/roberta-base config.json; RoBERTa paper / model card: 125M (encoder 124.6M + LM head)",
    ),
    ProductionArch(
        "lm",
        "openai-community/gpt2-large",
        CAUSAL_LM,
        GPT2_LARGE,
        774e6,
        0.001,
        "openai-community/gpt2-large config.json; model card: 774M",
    ),
    ProductionArch(
        "sentence",
        "sentence-transformers/all-MiniLM-L6-v2",
        BERT,
        MINILM_L6,
        22.7e6,
        0.005,
        "sentence-transformers/all-MiniLM-L6-v2 config.json; Hub: 22.7M",
    ),
    ProductionArch(
        "captioner",
        "Salesforce/blip-image-captioning-base",
        BLIP,
        BLIP_BASE,
        247.4e6,
        0.001,
        "Salesforce/blip-image-captioning-base config.json; Hub: 247M, the "
        "checkpoint's tensors, where the LM head stores its own copy of the tied "
        "30524 x 768 word embeddings (224.0M distinct)",
        counts_tied_copies=True,
    ),
)
ARCHS = {arch.name: arch for arch in PRODUCTION_ARCHS}


def build_empty(arch: ProductionArch):
    """`arch`'s model with empty weights on the meta device: real shapes, no memory."""
    import torch

    with torch.device("meta"):
        return _construct(arch.family, arch.config).eval()


def build_random(arch: ProductionArch, seed: int = 0):
    """`arch`'s model at its real size with random weights in CPU memory (`counterfactory
    doctor`: real memory and compute, no download); `seed` makes the weights reproducible."""
    import torch

    torch.manual_seed(seed)
    return _construct(arch.family, arch.config).eval()


def _construct(family: str, config: dict[str, Any]):
    if family in (UNET, VAE, SD3_TRANSFORMER, FLUX_TRANSFORMER):
        import diffusers

        classes = {
            UNET: diffusers.UNet2DConditionModel,
            VAE: diffusers.AutoencoderKL,
            SD3_TRANSFORMER: diffusers.SD3Transformer2DModel,
            FLUX_TRANSFORMER: diffusers.FluxTransformer2DModel,
        }
        return classes[family].from_config(config)
    if family == OPEN_CLIP:
        import open_clip

        return open_clip.CLIP(**config)
    import transformers as tf

    classes = {
        CLIP_TEXT: (tf.CLIPTextModel, tf.CLIPTextConfig),
        CLIP_TEXT_PROJ: (tf.CLIPTextModelWithProjection, tf.CLIPTextConfig),
        T5_ENCODER: (tf.T5EncoderModel, tf.T5Config),
        CLIP: (tf.CLIPModel, tf.CLIPConfig),
        MLM: (tf.RobertaForMaskedLM, tf.RobertaConfig),
        CAUSAL_LM: (tf.GPT2LMHeadModel, tf.GPT2Config),
        BERT: (tf.BertModel, tf.BertConfig),
        BLIP: (tf.BlipForConditionalGeneration, tf.BlipConfig),
    }
    if family not in classes:  # a cross-encoder (production_families): its transformers class
        model_cls = getattr(tf, family)
        return model_cls(model_cls.config_class(**config))
    model_cls, config_cls = classes[family]
    return model_cls(config_cls(**config))


def parameter_count(model, counts_tied_copies: bool = False) -> int:
    """Distinct parameters (tied embeddings counted once, as the model cards count them), or
    with `counts_tied_copies` every use of a tied parameter (as a checkpoint stores them)."""
    named = model.named_parameters(remove_duplicate=not counts_tied_copies)
    return sum(p.numel() for _, p in named)
