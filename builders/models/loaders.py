"""Loading a model from a Hub id or a local folder: one function per model role.

Production ids and the tiny local folders go through the same calls, so tests exercise the code
that real runs use. A missing local folder or an unreachable id is reported as a user error
naming the id and the `--models tiny` / `counterfactory models tiny DIR` way out.

Weights load from safetensors only unless the run passed `--trust-pickled-weights`
(`builders.models.pickled_weights`): a local folder is checked before any library opens it, a
Hub id is loaded with `use_safetensors=True`; trusted pickles still load with weights_only=True.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

from builders.engine.errors import UserFacingError
from builders.engine.precision import torch_dtype
from builders.models.clip_ids import ClipId
from builders.models.pickled_weights import (
    FLAG,
    PickledWeightsError,
    check_local,
    check_open_clip,
    pickled_weights_trusted,
    refused_global,
    use_safetensors,
)

log = logging.getLogger(__name__)


def _wrap(role: str, model_id: str, load):
    check_local(role, model_id, model_id)
    try:
        return load()
    except (OSError, ValueError, RuntimeError, pickle.UnpicklingError) as err:
        if isinstance(err, UserFacingError):
            raise
        refused = _unpickling_error(err)
        if refused is not None:
            # Only reached with --trust-pickled-weights: torch's weights_only loading refused an
            # object of the pickle, so none of it ran.
            raise PickledWeightsError(
                f"the {role} model {model_id!r}: its pickled weights hold {refused_global(refused)}, "
                "which torch's weights_only loading refused, so none of it ran; do not use these "
                "files, get the model as safetensors from a source you trust"
            ) from None
        if "safetensors" in str(err) and not pickled_weights_trusted() and not Path(model_id).exists():
            # A Hub id refused by use_safetensors=True (local folders are checked above).
            raise UserFacingError(
                f"the {role} model {model_id!r} has no safetensors weights ({_one_line(err, 200)}); "
                f"counterfactory loads safetensors only: pass {FLAG} if you trust its pickled "
                "weights"
            ) from err
        raise UserFacingError(
            f"cannot load the {role} model {model_id!r} ({type(err).__name__}: {_one_line(err, 300)}); "
            "check the id or path, your network/HF_TOKEN, or use the offline profile "
            "(`--models tiny`, built by `counterfactory models tiny DIR`)"
        ) from err


def _unpickling_error(err: BaseException | None) -> pickle.UnpicklingError | None:
    """The UnpicklingError behind `err`, if any (diffusers re-raises it as an OSError)."""
    while err is not None and not isinstance(err, pickle.UnpicklingError):
        err = err.__cause__ or err.__context__
    return err


def _one_line(err: Exception, limit: int) -> str:
    """A library's (often multi-line) message on one line: the error is one line."""
    return " ".join(str(err).split())[:limit]


def load_clip(model_id: str, device: str = "cpu", dtype: str = "fp32"):
    """transformers CLIP: `(model, processor)`, its weights in `dtype` (`fp32`, `fp16`, `bf16`)."""
    from transformers import CLIPModel, CLIPProcessor

    def load():
        model = CLIPModel.from_pretrained(
            model_id, dtype=torch_dtype(dtype), use_safetensors=use_safetensors(), weights_only=True
        )
        return model.to(device).eval(), CLIPProcessor.from_pretrained(model_id)

    return _wrap("CLIP", model_id, load)


def load_image_text_model(model_id: str, architecture: str, device: str = "cpu", dtype: str = "fp32"):
    """A cross-encoder (BLIP, BridgeTower, ViLT, FLAVA: builders/models/families.py) loaded as the
    transformers class `architecture` its config names: `(model, processor)`, its weights in
    `dtype` on `device`, both given once to `from_pretrained`."""
    import transformers

    def load():
        model = getattr(transformers, architecture).from_pretrained(
            model_id, dtype=torch_dtype(dtype), device_map=device, **_weights()
        )
        return model.eval(), transformers.AutoProcessor.from_pretrained(model_id)

    return _wrap(architecture, model_id, load)


def load_open_clip(clip: ClipId, device: str = "cpu", dtype: str = "fp32"):
    """open_clip CLIP: `(model, preprocess, tokenizer)` of an open_clip `clip` (parsed by
    `clip_ids`). The whole model is cast to `dtype` (open_clip's `pure_` precisions), as the
    transformers models are."""
    import open_clip

    def load():
        check_open_clip(clip.label, clip.name, clip.pretrained)
        model, _, preprocess = open_clip.create_model_and_transforms(
            clip.name, pretrained=clip.pretrained, device=device, weights_only=True
        )
        return model.to(torch_dtype(dtype)).eval(), preprocess, open_clip.get_tokenizer(clip.name)

    return _wrap("open_clip", clip.label, load)


def load_sd(model_id: str, inpaint: bool = False, device: str = "cpu", dtype: str = "fp32"):
    """A Stable Diffusion (or inpainting) pipeline in `dtype`, without the safety checker (images
    are filtered with CLIP downstream, and the checker is not part of the method)."""
    return load_generator("sd_inpaint" if inpaint else "sd", model_id, device=device, dtype=dtype)


#: Pipeline kinds of `load_generator`: diffusers class, role name in messages, and the keywords
#: that leave out what the method does not use (safety checker, invisible watermark: images are
#: filtered with CLIP downstream, neither is part of the method).
_PIPELINES = {
    "sd": ("StableDiffusionPipeline", "Stable Diffusion", {"safety_checker": None, "requires_safety_checker": False}),
    "sd_inpaint": (
        "StableDiffusionInpaintPipeline",
        "inpainting",
        {"safety_checker": None, "requires_safety_checker": False},
    ),
    "sdxl": ("StableDiffusionXLPipeline", "SDXL", {"add_watermarker": False}),
    "sd3": ("StableDiffusion3Pipeline", "SD3", {}),
    "flux": ("FluxPipeline", "FLUX", {}),
}


def load_generator(kind: str, model_id: str, device: str = "cpu", dtype: str = "fp32", cpu_offload: bool = False):
    """A diffusers pipeline of `kind` (`_PIPELINES`) in `dtype` on `device`. With `cpu_offload`
    (diffusers' `enable_model_cpu_offload`) the weights stay in CPU memory and each model moves
    to the GPU `device` only while it runs: for GPUs that cannot hold the whole pipeline
    (FLUX.1 in bf16), at the cost of the transfers."""
    import diffusers

    class_name, role, extra = _PIPELINES[kind]
    cls = getattr(diffusers, class_name)

    def load():
        # diffusers unpickles a trusted .bin with weights_only=True itself (no switch to pass).
        pipe = cls.from_pretrained(model_id, dtype=torch_dtype(dtype), use_safetensors=use_safetensors(), **extra)
        pipe.set_progress_bar_config(disable=True)
        if cpu_offload:
            pipe.enable_model_cpu_offload(device=device)
            return pipe
        return pipe.to(device)

    return _wrap(role, model_id, load)


def load_mlm(model_id: str, device: str = "cpu"):
    """Masked LM: `(model, tokenizer)`."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    def load():
        return (
            AutoModelForMaskedLM.from_pretrained(model_id, **_weights()).to(device).eval(),
            AutoTokenizer.from_pretrained(model_id),
        )

    return _wrap("masked LM", model_id, load)


def load_lm(model_id: str, device: str = "cpu"):
    """Causal LM for perplexity: `(model, tokenizer)`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def load():
        return (
            AutoModelForCausalLM.from_pretrained(model_id, **_weights()).to(device).eval(),
            AutoTokenizer.from_pretrained(model_id),
        )

    return _wrap("causal LM", model_id, load)


def load_captioner(model_id: str, device: str = "cpu"):
    """Image captioner: `(model, processor)` (BLIP-style image-text-to-text models)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    def load():
        return (
            AutoModelForImageTextToText.from_pretrained(model_id, **_weights()).to(device).eval(),
            AutoProcessor.from_pretrained(model_id),
        )

    return _wrap("captioner", model_id, load)


def load_sentence(model_id: str, device: str = "cpu") -> Any:
    """Sentence-similarity model (sentence-transformers)."""
    from sentence_transformers import SentenceTransformer

    # model_kwargs reach its transformers model; its extra modules (Dense) read model.safetensors
    # first and a pytorch_model.bin with weights_only=True (the local check covers a folder).
    return _wrap("sentence", model_id, lambda: SentenceTransformer(model_id, device=device, model_kwargs=_weights()))


def _weights() -> dict:
    """transformers `from_pretrained` keywords of the weight format."""
    return {"use_safetensors": use_safetensors(), "weights_only": True}
