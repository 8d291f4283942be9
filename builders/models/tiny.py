"""Tiny random-init models for tests and the demo, saved in the formats the real models use.

No weights can be downloaded on CI, so `build_tiny_models(DIR)` builds every model family the
builders and the trainer load — transformers CLIP, open_clip CLIP, Stable Diffusion (+ inpainting),
a RoBERTa masked LM, a GPT-2 LM and a BLIP captioner — with random weights and offline-built
tokenizers, and saves them with `save_pretrained` (or open_clip's `local-dir:` layout). They load
through exactly the code paths the production ids use (`builders.models.loaders`).

The MLM/LM tokenizer is a byte-level BPE trained on the shipped caption corpus with enough merges
that caption words are single tokens, so fill-mask proposals are whole words (as with
roberta-base) and the caption pipeline can be exercised meaningfully.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import torch

log = logging.getLogger(__name__)

ROLES = ("clip", "open_clip", "sd", "sd_inpaint", "mlm", "lm", "captioner")
DONE = "counterfactory_tiny_models.json"
#: Bump when the tiny models change, so old caches are rebuilt.
TINY_VERSION = 3
SEED = 0


def _caption_lines() -> list[str]:
    from counterfactory_metrics.odmap.class_match import COCO_CLASSES
    from builders.engine.nltk_setup import read_tagged_corpus

    lines = [" ".join(w for w, _ in sent) for sent in read_tagged_corpus()]
    return lines + [f"a photo of a {c}" for c in COCO_CLASSES]


def _bpe(vocab_size: int = 1200):
    """Byte-level BPE vocab + merges (merges as tuples: transformers 5 requires it)."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        _caption_lines(),
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        show_progress=False,
    )
    merges = json.loads(bpe.to_str())["model"]["merges"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges]
    return bpe.get_vocab(), merges


def clip_tokenizer(max_len: int = 77):
    """A CLIP tokenizer with a byte vocabulary and no merges (character-level, fully offline)."""
    from transformers import CLIPTokenizer

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    # GPT-2's byte -> unicode table: printable bytes map to themselves, the rest to 256+.
    extra = [b for b in range(256) if b not in printable]
    chars = [chr(c) for c in printable] + [chr(256 + i) for i in range(len(extra))]
    tokens = ["<|startoftext|>", "<|endoftext|>"] + chars + [c + "</w>" for c in chars]
    return CLIPTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=[], model_max_length=max_len)


def clip_text_config(vocab_size: int):
    """The tiny CLIP text tower every tiny model shares (CLIP, SD, SDXL's two encoders, SD3/FLUX's
    CLIP encoders): one definition, so the families differ only where their architectures do."""
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        projection_dim=16,
    )


def build_clip(out: Path) -> None:
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPVisionConfig

    tokenizer = clip_tokenizer()
    cfg = CLIPConfig(
        text_config=clip_text_config(len(tokenizer)).to_dict(),
        vision_config=CLIPVisionConfig(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
        ).to_dict(),
        projection_dim=16,
    )
    torch.manual_seed(SEED)
    CLIPModel(cfg).save_pretrained(out)
    images = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(out)


def build_open_clip(out: Path) -> None:
    import open_clip

    model_cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8, "head_width": 8},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 4, "layers": 2},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "open_clip_config.json").write_text(
        json.dumps(
            {
                "model_cfg": model_cfg,
                "preprocess_cfg": {
                    "mean": [0.48145466, 0.4578275, 0.40821073],
                    "std": [0.26862954, 0.26130258, 0.27577711],
                },
            },
            indent=1,
        )
    )
    torch.manual_seed(SEED)
    model = open_clip.CLIP(**model_cfg)
    from safetensors.torch import save_file

    save_file(model.state_dict(), str(out / "open_clip_model.safetensors"))


def _sd_components(in_channels: int) -> dict:
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel

    torch.manual_seed(SEED)
    unet = UNet2DConditionModel(
        block_out_channels=(4, 8),
        layers_per_block=1,
        sample_size=32,
        in_channels=in_channels,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        norm_num_groups=2,
    )
    vae = AutoencoderKL(
        block_out_channels=[4, 8],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2,
        latent_channels=4,
        norm_num_groups=2,
    )
    tokenizer = clip_tokenizer()
    text_encoder = CLIPTextModel(clip_text_config(len(tokenizer)))
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    return dict(
        unet=unet,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def build_sd(out: Path) -> None:
    from diffusers import StableDiffusionPipeline

    StableDiffusionPipeline(**_sd_components(4)).save_pretrained(out)


def build_sd_inpaint(out: Path) -> None:
    from diffusers import StableDiffusionInpaintPipeline

    StableDiffusionInpaintPipeline(**_sd_components(9)).save_pretrained(out)


def build_mlm(out: Path, vocab: dict, merges: list) -> None:
    from transformers import RobertaConfig, RobertaForMaskedLM, RobertaTokenizer

    tok = RobertaTokenizer(vocab=vocab, merges=merges)
    tok.save_pretrained(out)
    torch.manual_seed(SEED)
    model = RobertaForMaskedLM(
        RobertaConfig(
            vocab_size=len(vocab),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=130,
            pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
        )
    )
    # Like roberta-base in a caption context, propose whole caption words (" dog"), never word
    # pieces, bytes or special tokens: a random head would rank those as often as words.
    words = {w for line in _caption_lines() for w in line.split() if w.isalpha()}
    with torch.no_grad():
        for token, i in vocab.items():
            if not (token.startswith("Ġ") and token[1:] in words):
                model.lm_head.bias[i] = -20.0
    model.save_pretrained(out)


def build_lm(out: Path, vocab: dict, merges: list) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Tokenizer

    tok = GPT2Tokenizer(
        vocab=vocab, merges=merges, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    tok.save_pretrained(out)
    torch.manual_seed(SEED)
    GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(vocab),
            n_positions=128,
            n_embd=32,
            n_layer=2,
            n_head=4,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    ).save_pretrained(out)


def word_tokenizer(words, **kwargs):
    """A word-level BERT tokenizer (WordPiece over whole words) of `words`. Built from the vocab
    dict: transformers 5's BertTokenizer reads no `vocab_file` given to its constructor, and every
    word then becomes [UNK]."""
    from transformers import BertTokenizer

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(set(words))]
    return BertTokenizer(vocab={t: i for i, t in enumerate(dict.fromkeys(tokens))}, **kwargs)


def build_captioner(out: Path, vocab: dict) -> None:
    from transformers import BlipConfig, BlipForConditionalGeneration, BlipImageProcessor, BlipProcessor

    words = {w.lstrip("Ġ").lower() for w in vocab if w.lstrip("Ġ").isalpha()}
    tok = word_tokenizer(words, bos_token="[CLS]", sep_token="[SEP]")
    processor = BlipProcessor(image_processor=BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=tok)
    cfg = BlipConfig(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "encoder_hidden_size": 32,
            "max_position_embeddings": 64,
            "bos_token_id": tok.cls_token_id,
            "sep_token_id": tok.sep_token_id,
            "pad_token_id": tok.pad_token_id,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 32,
            "patch_size": 8,
        },
        projection_dim=16,
    )
    torch.manual_seed(SEED)
    BlipForConditionalGeneration(cfg).save_pretrained(out)
    processor.save_pretrained(out)


def _is_complete(root: Path, version: int = TINY_VERSION) -> bool:
    done = root / DONE
    return done.exists() and json.loads(done.read_text()).get("version") == version


def build_once(root: str | Path, build: Callable[[Path], None], version: int = TINY_VERSION) -> Path:
    """`build(folder)` into `root` unless a complete build of `version` is there; returns `root`.

    Several processes (`accelerate launch` ranks, parallel test runs) may ask for the same
    folder at once: one builds, the others wait and then find it complete."""
    from filelock import FileLock  # a dependency of huggingface_hub, torch and datasets

    root = Path(root)
    if _is_complete(root, version):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root.parent / f"{root.name}.lock")):
        if _is_complete(root, version):
            return root
        tmp = Path(tempfile.mkdtemp(prefix=root.name + ".building-", dir=root.parent))
        try:
            build(tmp)
            (tmp / DONE).write_text(json.dumps({"version": version}))
            # Built aside and swapped in: a crash leaves the old folder or none, never half a one.
            shutil.rmtree(root, ignore_errors=True)
            tmp.rename(root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("built the tiny models in %s", root)
    return root


def _build_roles(out: Path) -> None:
    vocab, merges = _bpe()
    build_clip(out / "clip")
    build_open_clip(out / "open_clip")
    build_sd(out / "sd")
    build_sd_inpaint(out / "sd_inpaint")
    build_mlm(out / "mlm", vocab, merges)
    build_lm(out / "lm", vocab, merges)
    build_captioner(out / "captioner", vocab)


def build_tiny_models(root: str | Path) -> dict[str, Path]:
    """Build (once) and return `role -> folder` for every tiny model under `root`. The image
    generators' tiny pipelines (SDXL, SD3, FLUX) are built on first use under
    `root/generators/` (`builders.counterfactuals.generators.generator_model`)."""
    root = build_once(root, _build_roles)
    return {role: root / role for role in ROLES}
