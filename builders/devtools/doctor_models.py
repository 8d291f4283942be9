"""The models `counterfactory doctor` runs: the production architectures with random weights
(`builders.models.production_configs.build_random`: real size, real memory, no download), or the
tiny profile's models (same families at reduced depth: the CI test of the doctor); the
cross-encoders the report scores likewise (builders/devtools/doctor_families.py).

Tokenizers and schedulers come from the tiny profile, which is built offline: the production
vocabularies are larger than the tiny ones, so every tiny token id is a valid production id, and
the work of a forward pass depends on the sequence length, not on which ids it holds. The CLIP
image processor is transformers' default, which is CLIP's (224 px, the OpenAI mean and std).

Components are cached by key and built on first use; `keep(keys)` frees the others, so a run
holds only what its remaining stages need (the SD UNet and gpt2-large are 3 GB each in fp32).
"""

from __future__ import annotations

import gc
import logging
from typing import Any, Callable

from builders.devtools.doctor_families import FAMILY_KEYS
from builders.models.profiles import ModelProfile

log = logging.getLogger(__name__)

#: Model profile names the doctor accepts.
SIZES = ("production", "tiny")


class ModelSource:
    """`get(key)` -> the component (cached); `params(key)` its parameter count."""

    def __init__(self, size: str, tiny: ModelProfile, device: str) -> None:
        if size not in SIZES:
            raise ValueError(f"size must be one of {SIZES}, got {size!r}")
        self.size, self.tiny, self.device = size, tiny, device
        self._cache: dict[str, Any] = {}
        self._modules: dict[str, list[Any]] = {}
        self._builders: dict[str, Callable[[], Any]] = {
            "mlm": self._mlm,
            "lm": self._lm,
            "sentence": self._sentence,
            "sd": lambda: self._sd(inpaint=False),
            "sd_inpaint": lambda: self._sd(inpaint=True),
            "clip_filter": lambda: self._clip("clip_filter"),
            "clip": lambda: self._clip("clip"),
            "open_clip": self._open_clip,
            **{key: (lambda key=key: self._cross_encoder(key)) for key in FAMILY_KEYS},
        }

    @property
    def production(self) -> bool:
        return self.size == "production"

    def get(self, key: str) -> Any:
        if key not in self._cache:
            log.info("doctor: building %s (%s)", key, self.size)
            self._cache[key] = self._builders[key]()
        return self._cache[key]

    def params(self, key: str) -> int:
        """Distinct parameters of the modules behind `key` (shared components counted once)."""
        seen: set[int] = set()
        total = 0
        for module in self._modules.get(key, []):
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
        return total

    def keep(self, keys: set[str]) -> None:
        """Free every cached component that is not in `keys`."""
        for key in [k for k in self._cache if k not in keys]:
            del self._cache[key]
            self._modules.pop(key, None)
        gc.collect()

    # -- builders ----------------------------------------------------------------------------

    def _random(self, name: str):
        from builders.models.production_configs import ARCHS, build_random

        return build_random(ARCHS[name]).to(self.device)

    def _mlm(self):
        from builders.models.loaders import load_mlm

        return self._text_model("mlm", load_mlm)

    def _lm(self):
        from builders.models.loaders import load_lm

        return self._text_model("lm", load_lm)

    def _text_model(self, role: str, load_tiny):
        """(model, tokenizer) of `role`: the production architecture with random weights and the
        tiny profile's tokenizer, or the tiny model itself."""
        from transformers import AutoTokenizer

        path = getattr(self.tiny, role)
        if self.production:
            model, tok = self._random(role), AutoTokenizer.from_pretrained(path)
        else:
            model, tok = load_tiny(path, self.device)
        self._modules[role] = [model]
        return model, tok

    def _sentence(self):
        from builders.models.loaders import load_sentence

        # The shipped all-MiniLM-L6-v2 is the production model itself (both profiles).
        model = load_sentence(self.tiny.sentence, self.device)
        self._modules["sentence"] = [model]
        return model

    def _sd(self, inpaint: bool):
        from diffusers import StableDiffusionInpaintPipeline, StableDiffusionPipeline

        from builders.models.loaders import load_sd

        key = "sd_inpaint" if inpaint else "sd"
        tiny = load_sd(self.tiny.sd_inpaint if inpaint else self.tiny.sd, inpaint=inpaint, device=self.device)
        if self.production:
            cls = StableDiffusionInpaintPipeline if inpaint else StableDiffusionPipeline
            pipe = cls(
                vae=self._random("sd.vae"),
                text_encoder=self._random("sd.text_encoder"),
                tokenizer=tiny.tokenizer,
                scheduler=tiny.scheduler,
                unet=self._random("sd_inpaint.unet" if inpaint else "sd.unet"),
                safety_checker=None,
                feature_extractor=None,
                requires_safety_checker=False,
            )
            pipe.set_progress_bar_config(disable=True)
        else:
            pipe = tiny
        self._modules[key] = [pipe.unet, pipe.vae, pipe.text_encoder]
        return pipe

    def _clip(self, role: str):
        """A `ClipScorer` (its `.model` is the transformers CLIPModel the trainer wraps too)."""
        from transformers import CLIPImageProcessor, CLIPProcessor

        from builders.models.clip import ClipScorer
        from builders.models.loaders import load_clip

        tiny_model, tiny_processor = load_clip(getattr(self.tiny, role), self.device)
        if self.production:
            model = self._random(role)
            processor = CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=tiny_processor.tokenizer)
        else:
            model, processor = tiny_model, tiny_processor
        self._modules[role] = [model]
        return ClipScorer(model, processor)

    def _open_clip(self):
        import open_clip

        from builders.models.clip import OpenClipScorer, load_scorer

        if self.production:
            model = self._random("open_clip")
            scorer = OpenClipScorer(
                model, open_clip.image_transform(224, is_train=False), open_clip.get_tokenizer("ViT-B-32")
            )
        else:
            scorer = load_scorer(self.tiny.open_clip, self.device)
        self._modules["open_clip"] = [scorer.model]
        return scorer

    def _cross_encoder(self, arch: str):
        """A cross-encoder's report backend (builders/devtools/doctor_families.py); the tiny
        families live beside the tiny profile's models."""
        from pathlib import Path

        from builders.devtools.doctor_families import cross_encoder

        backend = cross_encoder(arch, Path(self.tiny.clip).parent, self.production, self.device)
        self._modules[arch] = [backend.module]
        return backend
