"""Tiny random-init cross-encoders of the papers' other families (BLIP, BridgeTower, ViLT, FLAVA),
built offline like the tiny CLIPs (builders/models/tiny.py) and saved with `save_pretrained`
(safetensors) with their processors, so tests and the demo score each family through the CLI.

Each is the head the report scores (builders/models/families.py): `BlipForImageTextRetrieval`,
`BridgeTowerForImageAndTextRetrieval`, `ViltForImageAndTextRetrieval` and `FlavaForPreTraining`,
with hidden size 32, 2 layers and 32-pixel images; and BridgeTower's contrastive head,
`BridgeTowerForContrastiveLearning` (`bridgetower-itc`), 64 wide throughout: its forward adds
text-width token-type embeddings to the image tokens, so its towers must be as wide as each other;
and FLAVA's contrastive model, `FlavaModel` (`flava-itc`), of the tiny FLAVA's config. The
word-level tokenizers know the tiny caption corpus (builders/models/tiny.py), so captions are
words, not unknown tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from builders.models.tiny import SEED, _bpe, _caption_lines, build_once, word_tokenizer

FAMILY_ROLES = ("blip", "bridgetower", "bridgetower-itc", "vilt", "flava", "flava-itc")
#: Bump when these models change, so old caches are rebuilt.
FAMILIES_VERSION = 4
#: The sizes every tiny family shares.
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
IMAGE = 32


#: Words of the colour-and-shape captions the tests and the demo's synthetic sets use, beside the
#: caption corpus: a caption of unknown words would give every pair the same text.
EXTRA_WORDS = ("red", "green", "blue", "yellow", "purple", "orange", "black", "white", "cube", "colour", "color")


def _bert_tokenizer():
    """A word-level BERT tokenizer of the tiny caption corpus and the colour words."""
    words = {w.lower() for line in _caption_lines() for w in line.split() if w.isalpha()} | set(EXTRA_WORDS)
    return word_tokenizer(words, model_max_length=40)


def build_blip_itm(out: Path) -> None:
    from transformers import BlipConfig, BlipForImageTextRetrieval, BlipImageProcessor, BlipProcessor

    tok = _bert_tokenizer()
    text = {**TINY, "vocab_size": len(tok), "encoder_hidden_size": 32, "max_position_embeddings": 64}
    text.update(bos_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id, pad_token_id=tok.pad_token_id)
    cfg = BlipConfig(text_config=text, vision_config={**TINY, "image_size": IMAGE, "patch_size": 8}, projection_dim=16)
    torch.manual_seed(SEED)
    BlipForImageTextRetrieval(cfg).save_pretrained(out)
    images = BlipImageProcessor(size={"height": IMAGE, "width": IMAGE})
    BlipProcessor(image_processor=images, tokenizer=tok).save_pretrained(out)


def build_bridgetower(out: Path, contrastive: bool = False) -> None:
    import transformers as tf

    vocab, merges = _bpe()
    tok = tf.RobertaTokenizer(vocab=vocab, merges=merges, model_max_length=40)
    # Its vision tower has hidden_size // 64 heads: 64 is its smallest width.
    width = {"hidden_size": 64} if contrastive else {}
    # The contrastive head's settings, as bridgetower-large-itm-mlm-itc's config.json names them.
    itc = {"contrastive_hidden_size": 16, "logit_scale_init_value": 2.6592} if contrastive else {}
    cfg = tf.BridgeTowerConfig(
        **{k: v for k, v in TINY.items() if k != "intermediate_size"} | width,
        text_config={**TINY, "vocab_size": len(vocab), "max_position_embeddings": 64, "pad_token_id": 1} | width,
        vision_config={"hidden_size": 64, "num_hidden_layers": 2, "image_size": IMAGE},
        **itc,
    )
    cfg.vision_config.patch_size = 8
    torch.manual_seed(SEED)
    head = tf.BridgeTowerForContrastiveLearning if contrastive else tf.BridgeTowerForImageAndTextRetrieval
    head(cfg).save_pretrained(out)
    images = tf.BridgeTowerImageProcessor(size={"shortest_edge": IMAGE}, crop_size={"shortest_edge": IMAGE})
    tf.BridgeTowerProcessor(image_processor=images, tokenizer=tok).save_pretrained(out)


def build_vilt(out: Path) -> None:
    from transformers import ViltConfig, ViltForImageAndTextRetrieval, ViltImageProcessor, ViltProcessor

    tok = _bert_tokenizer()
    cfg = ViltConfig(**TINY, vocab_size=len(tok), image_size=IMAGE, patch_size=8, max_position_embeddings=40)
    torch.manual_seed(SEED)
    ViltForImageAndTextRetrieval(cfg).save_pretrained(out)
    images = ViltImageProcessor(size={"shortest_edge": IMAGE}, size_divisor=8)
    ViltProcessor(image_processor=images, tokenizer=tok).save_pretrained(out)


def build_flava(out: Path, contrastive: bool = False) -> None:
    from transformers import FlavaConfig, FlavaForPreTraining, FlavaImageProcessor, FlavaModel, FlavaProcessor

    tok = _bert_tokenizer()
    cfg = FlavaConfig(
        image_config={**TINY, "image_size": IMAGE, "patch_size": 8},
        text_config={**TINY, "vocab_size": len(tok), "max_position_embeddings": 64},
        multimodal_config=dict(TINY),
        image_codebook_config={"hidden_size": 16, "num_groups": 1, "num_blocks_per_group": 1, "vocab_size": 64},
        hidden_size=32,
        projection_dim=16,
    )
    torch.manual_seed(SEED)
    (FlavaModel if contrastive else FlavaForPreTraining)(cfg).save_pretrained(out)
    images = FlavaImageProcessor(
        size={"height": IMAGE, "width": IMAGE}, crop_size={"height": IMAGE, "width": IMAGE}, input_size_patches=4
    )
    FlavaProcessor(image_processor=images, tokenizer=tok).save_pretrained(out)


BUILDERS: dict[str, Callable[[Path], None]] = {
    "blip": build_blip_itm,
    "bridgetower": build_bridgetower,
    "bridgetower-itc": lambda out: build_bridgetower(out, contrastive=True),
    "vilt": build_vilt,
    "flava": build_flava,
    "flava-itc": lambda out: build_flava(out, contrastive=True),
}


def _build_all(out: Path) -> None:
    for role, build in BUILDERS.items():
        build(out / role)


def build_tiny_families(root: str | Path) -> dict[str, Path]:
    """Build (once) and return `family -> folder` of every tiny cross-encoder under `root`."""
    root = build_once(root, _build_all, FAMILIES_VERSION)
    return {role: root / role for role in FAMILY_ROLES}
