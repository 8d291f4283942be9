"""Two CLIP implementations behind one trainable interface: transformers `CLIPModel` and open_clip.

A backend owns the model (an `nn.Module` whose forward returns normalised image and text
features and the logit scale, so DDP sees every forward), the picklable image transform and
tokenizer the DataLoader workers use, and saving in the backend's own format:
`save_pretrained` folders for transformers, open_clip's `local-dir:` layout
(`open_clip_config.json` + `open_clip_model.safetensors`) for open_clip. Both load back with the
same `--model` flag (`--model runs/x/final`). Reading the id, loading and reading transformers'
outputs are `builders.models`' (`clip_ids`, `loaders`, `clip.features`), shared with every stage.

Images reach the backend's own steps as decoded, in their own PIL mode: each reference turns them
into RGB at its own point. transformers composites transparency over white before anything else
(`image_transforms.convert_to_rgb`); open_clip resizes and crops or pads in the image's mode and
converts to RGB last (`MaybeConvertMode`: alpha dropped after the resize, a CMYK image padded in
CMYK, where 0 is white). Converting first, as both once did here, moved RGBA, LA and transparent
palette PNGs by up to 255 grey levels from transformers and 109 from open_clip, and a CMYK JPEG
under open_clip's `resize_mode=longest` by 85 on average.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torchvision import transforms

from builders.models.clip import features
from builders.models.clip_ids import TRANSFORMERS, ClipId, open_clip_model_config
from builders.models.cross_encoders import COSINE_S
from builders.models.loaders import load_clip, load_open_clip
from builders.models.rgb import TransformersRGB


class DualEncoder(nn.Module):
    """forward(pixel_values, text) -> (image features, text features, logit scale), L2-normalised."""

    def encode_image(self, pixel_values: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def encode_text(self, text: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def logit_scale(self) -> torch.Tensor:
        raise NotImplementedError

    def logit_bias(self) -> torch.Tensor | None:
        """SigLIP's learnt logit bias; None for a CLIP model (no such parameter)."""
        return getattr(self.model, "logit_bias", None)

    def forward(self, pixel_values=None, text=None, negative_text=None, with_bias: bool = False):
        """(image, text, negative text features, logit scale), and the logit bias last with
        `with_bias` (the sigmoid loss needs it; a parameter used in the forward, as DDP wants)."""
        img = F.normalize(self.encode_image(pixel_values), dim=-1) if pixel_values is not None else None
        txt = F.normalize(self.encode_text(text), dim=-1) if text is not None else None
        neg = F.normalize(self.encode_text(negative_text), dim=-1) if negative_text is not None else None
        if with_bias:
            return img, txt, neg, self.logit_scale(), self.logit_bias()
        return img, txt, neg, self.logit_scale()


class HFClip(DualEncoder):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def encode_image(self, pixel_values):
        return features(self.model.get_image_features(pixel_values=pixel_values))

    def encode_text(self, text):
        return features(self.model.get_text_features(**text))

    def logit_scale(self):
        return self.model.logit_scale.exp()

    def is_image_param(self, name: str) -> bool:
        return name.startswith(("model.vision_model.", "model.visual_projection."))

    def is_text_param(self, name: str) -> bool:
        return name.startswith(("model.text_model.", "model.text_projection."))


class OpenClip(DualEncoder):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def encode_image(self, pixel_values):
        return self.model.encode_image(pixel_values)

    def encode_text(self, text):
        return self.model.encode_text(text["input_ids"])

    def logit_scale(self):
        return self.model.logit_scale.exp()

    def is_image_param(self, name: str) -> bool:
        return name.startswith("model.visual.")

    def is_text_param(self, name: str) -> bool:
        # The text tower is everything outside `visual` but the shared temperature / bias.
        return not self.is_image_param(name) and name not in ("model.logit_scale", "model.logit_bias")


class HFTokenize:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, texts):
        # Padding to the longest caption of the batch: the causal text tower pools at the end
        # token, which never attends to the padding after it.
        out = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.tokenizer.model_max_length, return_tensors="pt"
        )
        return {"input_ids": out["input_ids"], "attention_mask": out["attention_mask"]}


class OpenClipTokenize:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, texts):
        return {"input_ids": self.tokenizer(texts)}


#: A CLIP's ITM score G: the cosine of the two embeddings (the default), or CLIP's own
#: `logits_per_text`, the learnt logit scale times the cosine (`counterfactory benchmark --clip-g`).
COSINE, CLIP_LOGITS = "cosine", "logits_per_text"


class Backend:
    """What the trainer needs from a CLIP implementation. Built by `load_backend`."""

    #: Retrieval by embedding (a cross-encoder scores pairs instead: builders/models/cross_encoders.py).
    dual_encoder = True
    #: The ITM score G of the deltas (COSINE or CLIP_LOGITS).
    g_kind = COSINE
    #: PN's s(x, y): the cosine mapped to [0, 1], (cos + 1) / 2 (training/evaluation.py).
    s_kind = COSINE_S

    def __init__(
        self,
        clip: ClipId,
        module: DualEncoder,
        pixels: PixelPipeline,
        tokenize,
        extra,
        input_size: int | tuple[int, int] | None = None,
    ) -> None:
        self.clip, self.module = clip, module
        #: transformers or open_clip, and the model as messages name it.
        self.kind, self.model_id = clip.backend, clip.label
        self.pixels, self.tokenize, self._extra = pixels, tokenize, extra
        self.image_size = pixels.size
        #: The model's input size as its library gives it (open_clip: maybe (height, width)).
        self.input_size = input_size or pixels.size

    @property
    def has_logit_bias(self) -> bool:
        return self.module.logit_bias() is not None

    def train_pixels(self, aug_cfg: dict[str, Any]) -> PixelPipeline:
        """`--augment`: open_clip's train transform (`open_clip.image_transform(is_train=True,
        aug_cfg=...)`: RandomResizedCrop(scale=(0.9, 1.0)) bicubic to the input size, then its
        RGB conversion and the `--aug-cfg` colour jitter / grey scale), with this backend's mean
        and std in the per-batch half; for transformers after its own RGB conversion (transparency
        over white), which comes first there."""
        import open_clip

        p = self.pixels
        with warnings.catch_warnings():
            # open_clip 3.3.0 takes only `scale` out of the dict it then calls unused, and so warns
            # of the colour jitter it does apply; the keys were checked (augmentation.parse_aug_cfg).
            warnings.filterwarnings("ignore", message="Unused augmentation cfg items")
            train = open_clip.image_transform(
                self.input_size, is_train=True, mean=p.mean, std=p.std, aug_cfg=dict(aug_cfg)
            )
        first = (TransformersRGB(),) if self.kind == TRANSFORMERS else ()
        return PixelPipeline(p.size, p.mean, p.std, first + _until_to_tensor(train))

    def freeze(self, lock_image: bool, lock_text: bool) -> None:
        """`--lock-image` / `--lock-text`: the tower's weights get no gradient (and no update)."""
        for name, p in self.module.named_parameters():
            if (lock_image and self.module.is_image_param(name)) or (lock_text and self.module.is_text_param(name)):
                p.requires_grad_(False)

    def enable_grad_checkpointing(self) -> None:
        """`--grad-checkpointing`: each transformer block's activations are recomputed in the
        backward pass instead of kept, in both towers."""
        if self.kind == TRANSFORMERS:
            # Non-reentrant, as open_clip's: correct with a frozen tower (inputs without grad)
            # and under DDP.
            self.module.model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            self.module.model.set_grad_checkpointing(True)

    def save(self, module: DualEncoder, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        if self.kind == TRANSFORMERS:
            module.model.save_pretrained(out)
            self._extra.save_pretrained(out)  # the processor
            return
        from safetensors.torch import save_file

        (out / "open_clip_config.json").write_text(json.dumps(self._extra, indent=1))
        save_file(
            {k: v.contiguous() for k, v in module.model.state_dict().items()}, str(out / "open_clip_model.safetensors")
        )


class FloorCenterCrop:
    """Centre crop with transformers' offsets, `int((H - h) / 2)`: torchvision's `CenterCrop`
    rounds half up, one pixel off transformers on an odd margin (a 427x640 photo)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img: Image.Image) -> Image.Image:
        left, top = int((img.width - self.size) / 2), int((img.height - self.size) / 2)
        return img.crop((left, top, left + self.size, top + self.size))


@dataclass(frozen=True)
class PixelPipeline:
    """CLIP's preprocessing in two halves: per image in the DataLoader workers, the backend's own
    reference steps up to its tensor conversion (resize + centre crop) to uint8 (4x less to ship
    between processes than float), then per batch in the training process, vectorised: scale to
    [0, 1] and normalise. Built by `transformers_pixels` / `open_clip_pixels`, so the inputs equal
    the backend's processor (within 1 grey level: transformers resizes tensors, we resize PIL)."""

    size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    #: PIL -> PIL steps of the backend's reference transform (resize, crop, and its conversion to
    #: RGB where the reference does it), from the image as decoded to an RGB image.
    steps: tuple = ()

    def per_image(self):
        return transforms.Compose([*self.steps, transforms.PILToTensor()])

    def per_batch(self, images: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(self.mean).view(1, -1, 1, 1)
        std = torch.tensor(self.std).view(1, -1, 1, 1)
        return (images.float() / 255 - mean) / std


def transformers_pixels(ip) -> PixelPipeline:
    """The steps of a transformers CLIP image processor: RGB (transparency over white), resize
    (short side, or to height x width) with its resample filter, then its centre crop."""
    interpolation = (
        ip.resample
        if isinstance(ip.resample, transforms.InterpolationMode)
        else transforms.InterpolationMode(Image.Resampling(ip.resample).name.lower())
    )
    size = dict(ip.size)
    short = size.get("shortest_edge")
    resize = transforms.Resize(short if short else (size["height"], size["width"]), interpolation=interpolation)
    crop = ip.crop_size["height"] if ip.do_center_crop else (short or size["height"])
    return PixelPipeline(
        crop, tuple(ip.image_mean), tuple(ip.image_std), (TransformersRGB(), resize, FloorCenterCrop(crop))
    )


def _until_to_tensor(transform) -> tuple:
    """The PIL steps of an open_clip transform `[..., ToTensor, Normalize]` (its Normalize is the
    per-batch half)."""
    steps = list(transform.transforms)
    cut = next((i for i, t in enumerate(steps) if type(t).__name__.endswith("ToTensor")), None)
    if cut is None or not isinstance(steps[-1], transforms.Normalize):
        raise ValueError(f"open_clip's transform is not [..., ToTensor, Normalize]: {transform}")
    return tuple(steps[:cut])


def open_clip_pixels(preprocess, size: int, cfg: dict) -> PixelPipeline:
    """open_clip's own eval transform up to its ToTensor (its resize mode, interpolation, crop or
    pad and its RGB conversion, whatever the model's preprocess_cfg says)."""
    return PixelPipeline(size, tuple(cfg["mean"]), tuple(cfg["std"]), _until_to_tensor(preprocess))


def load_backend(clip: ClipId) -> Backend:
    """The backend of `clip` (parsed by `builders.models.clip_ids` where the id came in): a
    transformers Hub id or save_pretrained folder, or an open_clip architecture with its tag,
    `hf-hub:...` or `local-dir:PATH`."""
    if clip.backend == TRANSFORMERS:
        model, processor = load_clip(clip.name)
        ip = processor.image_processor
        return Backend(
            clip, HFClip(model.train()), transformers_pixels(ip), HFTokenize(processor.tokenizer), processor
        )
    model, preprocess, tokenizer = load_open_clip(clip)
    cfg = model.visual.preprocess_cfg
    input_size = model.visual.image_size
    input_size = tuple(input_size) if isinstance(input_size, (tuple, list)) else input_size
    size = input_size[0] if isinstance(input_size, tuple) else input_size
    saved = {"model_cfg": open_clip_model_config(clip), "preprocess_cfg": dict(cfg)}
    return Backend(
        clip,
        OpenClip(model.train()),
        open_clip_pixels(preprocess, size, cfg),
        OpenClipTokenize(tokenizer),
        saved,
        input_size,
    )
