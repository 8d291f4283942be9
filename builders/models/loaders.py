"""Loading a model from a Hub id or a local folder: one function per model role.

Production ids and the tiny local folders go through the same calls, so tests exercise the code
that real runs use. A missing local folder or an unreachable id is reported as a user error
naming the id and the `--models tiny` / `counterfactory models tiny DIR` way out.
"""

from __future__ import annotations

import logging
from typing import Any

from builders.engine.errors import UserFacingError
from builders.engine.precision import torch_dtype
from builders.models.clip_ids import OPEN_CLIP, parse_clip_id

log = logging.getLogger(__name__)


def _wrap(role: str, model_id: str, load):
    try:
        return load()
    except (OSError, ValueError, RuntimeError) as err:
        if isinstance(err, UserFacingError):
            raise
        raise UserFacingError(
            f"cannot load the {role} model {model_id!r} ({type(err).__name__}: {str(err)[:300]}); "
            "check the id or path, your network/HF_TOKEN, or use the offline profile "
            "(`--models tiny`, built by `counterfactory models tiny DIR`)") from err


def load_clip(model_id: str, device: str = "cpu", dtype: str = "fp32"):
    """transformers CLIP: `(model, processor)`, its weights in `dtype` (`fp32`, `fp16`, `bf16`)."""
    from transformers import CLIPModel, CLIPProcessor

    def load():
        model = CLIPModel.from_pretrained(model_id, dtype=torch_dtype(dtype))
        return model.to(device).eval(), CLIPProcessor.from_pretrained(model_id)

    return _wrap("CLIP", model_id, load)


def load_open_clip(model_id: str, device: str = "cpu", dtype: str = "fp32"):
    """open_clip CLIP: `(model, preprocess, tokenizer)`; `model_id` as `clip_ids` reads it for
    the open_clip backend. The whole model is cast to `dtype` (open_clip's `pure_` precisions),
    as the transformers models are."""
    import open_clip

    clip = parse_clip_id(model_id, OPEN_CLIP)

    def load():
        model, _, preprocess = open_clip.create_model_and_transforms(clip.name, pretrained=clip.pretrained,
                                                                     device=device)
        return model.to(torch_dtype(dtype)).eval(), preprocess, open_clip.get_tokenizer(clip.name)

    return _wrap("open_clip", model_id, load)


def load_sd(model_id: str, inpaint: bool = False, device: str = "cpu", dtype: str = "fp32"):
    """A Stable Diffusion (or inpainting) pipeline in `dtype`, without the safety checker (images
    are filtered with CLIP downstream, and the checker is not part of the method)."""
    from diffusers import StableDiffusionInpaintPipeline, StableDiffusionPipeline

    cls = StableDiffusionInpaintPipeline if inpaint else StableDiffusionPipeline

    def load():
        pipe = cls.from_pretrained(model_id, safety_checker=None, requires_safety_checker=False,
                                   dtype=torch_dtype(dtype))
        pipe.set_progress_bar_config(disable=True)
        return pipe.to(device)

    return _wrap("inpainting" if inpaint else "Stable Diffusion", model_id, load)


def load_mlm(model_id: str, device: str = "cpu"):
    """Masked LM: `(model, tokenizer)`."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    def load():
        return (AutoModelForMaskedLM.from_pretrained(model_id).to(device).eval(),
                AutoTokenizer.from_pretrained(model_id))

    return _wrap("masked LM", model_id, load)


def load_lm(model_id: str, device: str = "cpu"):
    """Causal LM for perplexity: `(model, tokenizer)`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def load():
        return (AutoModelForCausalLM.from_pretrained(model_id).to(device).eval(),
                AutoTokenizer.from_pretrained(model_id))

    return _wrap("causal LM", model_id, load)


def load_captioner(model_id: str, device: str = "cpu"):
    """Image captioner: `(model, processor)` (BLIP-style image-text-to-text models)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    def load():
        return (AutoModelForImageTextToText.from_pretrained(model_id).to(device).eval(),
                AutoProcessor.from_pretrained(model_id))

    return _wrap("captioner", model_id, load)


def load_sentence(model_id: str, device: str = "cpu") -> Any:
    """Sentence-similarity model (sentence-transformers)."""
    from sentence_transformers import SentenceTransformer

    return _wrap("sentence", model_id, lambda: SentenceTransformer(model_id, device=device))
