"""The papers' cross-encoders at their published size (builders/models/production_families.py), on
the meta device: each parameter count equals the layer arithmetic of its architecture written out
here (embeddings, transformer layers, heads: widths, depths and vocabularies from the checkpoints'
configs), and the towers with a published size match it (ViT paper Table 1: ViT-Base 86M,
ViT-Large 307M; RoBERTa's release: roberta.large 355M)."""

from __future__ import annotations

import pytest
import torch

from builders.models.production_configs import build_empty, parameter_count
from builders.models.production_families import FAMILY_ARCH, FAMILY_ARCHS


def lin(i: int, o: int) -> int:
    return i * o + o


def ln(h: int) -> int:
    return 2 * h


def layer(h: int, inner: int, cross: int = 0) -> int:
    """A post- or pre-LN transformer layer: self-attention (q, k, v, out), FFN, two LayerNorms;
    with `cross`, a cross-attention to `cross`-wide tokens and its LayerNorm."""
    n = 4 * lin(h, h) + ln(h) + lin(h, inner) + lin(inner, h) + ln(h)
    return n + (2 * lin(h, h) + 2 * lin(cross, h) + ln(h) if cross else 0)


def conv(i: int, o: int, k: int, bias: bool = True) -> int:
    return i * o * k * k + (o if bias else 0)


def vit(h: int, inner: int, layers: int, image: int, patch: int, bias: bool = True) -> int:
    """Patch embedding, class token, positions of the patches and the class token, the layers."""
    return conv(3, h, patch, bias) + h + ((image // patch) ** 2 + 1) * h + layers * layer(h, inner)


def blip_vision(h: int, inner: int, layers: int) -> int:
    return vit(h, inner, layers, 384, 16) + ln(h)


def blip(h: int, inner: int, layers: int) -> int:
    """ViT at 384 px, BERT-base (30524 words) cross-attending to it, ITC projections to 256, ITM."""
    text = 30524 * 768 + 512 * 768 + ln(768) + 12 * layer(768, 3072, cross=h)
    return blip_vision(h, inner, layers) + text + lin(h, 256) + lin(768, 256) + lin(768, 2)


def vilt() -> int:
    """Word embeddings (40 positions, 2 token types), 32 px patches of 384 px (12 x 12 + class),
    2 modality types, one ViT-B, its pooler and the one-logit retrieval head."""
    text = 30522 * 768 + 40 * 768 + 2 * 768 + ln(768)
    patches = conv(3, 768, 32) + 768 + 145 * 768 + 2 * 768
    return text + patches + 12 * layer(768, 3072) + ln(768) + lin(768, 768) + lin(768, 1)


def roberta_large() -> int:
    """RoBERTa-large with its pooler (50265 words, 514 positions, one token type)."""
    h = 1024
    return 50265 * h + 514 * h + h + ln(h) + 24 * layer(h, 4096) + lin(h, h)


def bridgetower() -> int:
    """RoBERTa-large, CLIP ViT-L/14 at 294 px (no patch bias; pre and post LayerNorm), per side a
    transform into the cross-modal width, 6 cross-modal layers, a pooler, a LayerNorm and 5 'add'
    link towers (a LayerNorm each), 2 token types, and the ITM head on both poolers."""
    h = 1024
    vision = vit(h, 4096, 24, 294, 14, bias=False) + 2 * ln(h)
    per_side = lin(h, h) + 6 * layer(h, 4096, cross=h) + lin(h, h) + ln(h) + 5 * ln(h)
    return roberta_large() + vision + 2 * per_side + 2 * h + lin(2 * h, 2)


def bridgetower_itc() -> int:
    """BridgeTower's towers without the ITM head: ITC heads to 512 on the text and image [CLS] and
    on both poolers, and the logit scale."""
    h = 1024
    return bridgetower() - lin(2 * h, 2) + 2 * lin(h, 512) + lin(2 * h, 512) + 1


def dalle_encoder(n: int = 256, vocab: int = 8192) -> int:
    """FLAVA's image codebook, the DALL-E encoder: a 7x7 input conv, 4 groups of 2 residual blocks
    (widths n, 2n, 4n, 8n; 3x3, 3x3, 3x3, 1x1 convs at a quarter width; a 1x1 conv on the
    identity path where the width changes) and a 1x1 conv to the codes."""
    total, width = conv(3, n, 7), n
    for group in range(4):
        out = n * 2**group
        for _ in range(2):
            hid = out // 4
            identity = conv(width, out, 1) if width != out else 0
            total += identity + conv(width, hid, 3) + 2 * conv(hid, hid, 3) + conv(hid, out, 1)
            width = out
    return total + conv(8 * n, vocab, 1)


def flava_itc() -> int:
    """FlavaModel: ViT-B/16 image encoder (with a mask token), BERT-base text encoder, 6
    multimodal layers, each with a final LayerNorm and pooler; 4 projections and the logit scale."""
    h = 768
    image = vit(h, 3072, 12, 224, 16) + h + ln(h) + lin(h, h)
    text = 30522 * h + 512 * h + 2 * h + ln(h) + 12 * layer(h, 3072) + ln(h) + lin(h, h)
    multimodal = 6 * layer(h, 3072) + h + ln(h) + lin(h, h)
    return image + text + multimodal + 4 * lin(h, h) + 1


def flava() -> int:
    """FlavaForPreTraining: FlavaModel, the MLM and MIM heads twice (unimodal and multimodal), the
    ITM head, and the codebook."""
    h = 768
    mlm, mim = (lin(h, h) + ln(h) + lin(h, vocab) for vocab in (30522, 8192))
    itm = lin(h, h) + lin(h, 2)
    return flava_itc() + 2 * mlm + 2 * mim + itm + dalle_encoder()


ARITHMETIC = {
    "blip_itm_base": lambda: blip(768, 3072, 12),
    "blip_itm_large": lambda: blip(1024, 4096, 24),
    "bridgetower_large_itm": bridgetower,
    "bridgetower_large_itc": bridgetower_itc,
    "vilt_coco": vilt,
    "flava_full": flava,
    "flava_full_itc": flava_itc,
}


def test_every_family_has_a_production_architecture():
    assert set(FAMILY_ARCH) == set(ARITHMETIC)
    assert {a.model_id for a in FAMILY_ARCHS} == {
        "Salesforce/blip-itm-base-coco",
        "Salesforce/blip-itm-large-coco",
        "BridgeTower/bridgetower-large-itm-mlm",
        "BridgeTower/bridgetower-large-itm-mlm-itc",
        "dandelin/vilt-b32-finetuned-coco",
        "facebook/flava-full",
    }


@pytest.mark.parametrize("arch", FAMILY_ARCHS, ids=lambda a: a.name)
def test_parameter_count_is_the_architectures_arithmetic(arch):
    model = build_empty(arch)
    assert all(p.device == torch.device("meta") for p in model.parameters())
    assert type(model).__name__ == arch.family  # the head --model scores
    assert parameter_count(model) == ARITHMETIC[arch.name](), arch.source


def test_towers_match_their_published_sizes():
    # ViT paper (Dosovitskiy et al. 2021) Table 1: ViT-Base 86M, ViT-Large 307M, counted with the
    # pre-logits layer and classifier (about 2M for Large) at 224 px; BLIP's towers have neither
    # and 380 more position embeddings at 384 px: within 1.5 %.
    base = parameter_count(build_empty(FAMILY_ARCH["blip_itm_base"]).vision_model)
    large = parameter_count(build_empty(FAMILY_ARCH["blip_itm_large"]).vision_model)
    assert base == pytest.approx(86e6, rel=0.015) and large == pytest.approx(307e6, rel=0.015)
    # fairseq's RoBERTa release: roberta.large, 355M parameters: BridgeTower's text tower.
    text = build_empty(FAMILY_ARCH["bridgetower_large_itm"]).bridgetower.text_model
    assert parameter_count(text) == pytest.approx(355e6, rel=0.005)
