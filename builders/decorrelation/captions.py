"""Captions y' for synthetic images x' (builders/decorrelation/METHOD.md §3), and class mentions of captions (§4).

Methods:

- `np_removal` (default): delete from an original caption every noun phrase that matches a
  removed class. COCO: NLTK chunking + the paper's matching table (`builders.engine.nltk_setup`). Flickr30k:
  the phrases that Flickr30k Entities annotates with a removed type. Captions are tried in a
  seeded random order and the first `captions_per_image` that can be rewritten are used; a caption
  that mentions no removed class is not used (it would not be a synthesised caption). When no
  caption works, the candidate is skipped with `caption_no_matching_noun_phrase` (no caption
  mentions a removed class) or `caption_nothing_left_after_removal` (every caption that does would
  be left without content words).
- `prompts`: one of the 80 CLIP ImageNet templates (drawn without replacement per image) filled
  with the present classes joined by " and ", e.g. "a photo of a dog and frisbee.".
- `captioner`: a transformers image-to-text model (BLIP-style) run on x' with greedy decoding,
  so it yields one caption per image (`captions_per_image` must be 1); an empty output is skipped
  with `caption_empty`.

All randomness comes from the `random.Random` the caller passes (seeded per row).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np
from PIL import Image

from builders.decorrelation.config import CLIP_TEMPLATES, CaptionConfig
from builders.engine.batching import ShrinkingBatches
from counterfactory_metrics.odmap.noun_phrases import (
    REASON_NO_MATCH,
    REASON_NOTHING_LEFT,
    NounPhraseCache,
    NpRemoval,
    remove_noun_phrases_with_reason,
)
from loading_scripts.records import SourceCaption

REASON_EMPTY = "caption_empty"


class PhraseMatcher(Protocol):
    """Which captions mention which classes, and noun-phrase removal, for one source."""

    def remove(self, caption: SourceCaption, removed: Sequence[str]) -> NpRemoval: ...

    def mentions(self, captions: Sequence[SourceCaption], class_names: Sequence[str]) -> np.ndarray: ...


class CocoPhrases:
    """NLTK noun phrases + the COCO matching table (builders/decorrelation/METHOD.md §4); chunking cached per caption."""

    def __init__(self) -> None:
        from counterfactory_metrics.odmap.class_match import ClassMatcher

        self.matcher = ClassMatcher()
        self.cache = NounPhraseCache()

    def remove(self, caption: SourceCaption, removed: Sequence[str]) -> NpRemoval:
        return remove_noun_phrases_with_reason(caption.text, removed, self.matcher, cache=self.cache)

    def mentions(self, captions: Sequence[SourceCaption], class_names: Sequence[str]) -> np.ndarray:
        from counterfactory_metrics.odmap.odmap_scores import gallery_mentions

        return gallery_mentions([c.text for c in captions], class_names, self.matcher, cache=self.cache)


_SPACE = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,;:!?])")
_LEADING_PUNCT = re.compile(r"^[\s,;:]+")
_WORD = re.compile(r"\w", re.UNICODE)


class EntityPhrases:
    """Flickr30k Entities: a phrase mentions class c when it is annotated with type c."""

    def remove(self, caption: SourceCaption, removed: Sequence[str]) -> NpRemoval:
        drop = [p for p in caption.phrases if set(p.types) & set(removed)]
        if not drop:
            return NpRemoval(None, REASON_NO_MATCH, ())
        text, pos, pieces = caption.text, 0, []
        for p in sorted(drop, key=lambda p: p.start):
            pieces.append(text[pos : p.start])
            pos = max(pos, p.end)
        pieces.append(text[pos:])
        out = _LEADING_PUNCT.sub("", _SPACE_BEFORE_PUNCT.sub(r"\1", _SPACE.sub(" ", "".join(pieces)))).strip()
        removed_text = tuple(text[p.start : p.end] for p in drop)
        if not _WORD.search(out):
            return NpRemoval(None, REASON_NOTHING_LEFT, removed_text)
        return NpRemoval(out, None, removed_text)

    def mentions(self, captions: Sequence[SourceCaption], class_names: Sequence[str]) -> np.ndarray:
        column = {c: j for j, c in enumerate(class_names)}
        out = np.zeros((len(captions), len(class_names)), dtype=bool)
        for i, caption in enumerate(captions):
            for phrase in caption.phrases:
                for t in phrase.types:
                    if t in column:
                        out[i, column[t]] = True
        return out


@dataclass(frozen=True)
class SynthCaption:
    text: str
    #: The original caption it was made from (np_removal), else None.
    source: SourceCaption | None = None


class CaptionSynthesizer:
    """Makes y' per `CaptionConfig`; the captioner model is loaded on first use."""

    def __init__(self, config: CaptionConfig, phrases: PhraseMatcher) -> None:
        self.config = config
        self.phrases = phrases
        self._captioner: Any = None
        self._batches = ShrinkingBatches(
            "decorrelation image captioning", 1, hint="try --dtype fp16 or a GPU with more memory"
        )

    def synthesize(
        self,
        captions: Sequence[SourceCaption],
        removed: Sequence[str],
        present: Sequence[str],
        image: Image.Image,
        rng: random.Random,
    ) -> tuple[list[SynthCaption], str | None]:
        """Up to `captions_per_image` captions, or ([], reason) when none can be made."""
        method = self.config.method
        if method == "np_removal":
            return self._np_removal(captions, removed, rng)
        if method == "prompts":
            templates = rng.sample(CLIP_TEMPLATES, self.config.captions_per_image)
            return [SynthCaption(t.format(" and ".join(present))) for t in templates], None
        text = self._batches.call(self._caption_image, image)
        return ([SynthCaption(text)], None) if text else ([], REASON_EMPTY)

    def _np_removal(
        self, captions: Sequence[SourceCaption], removed: Sequence[str], rng: random.Random
    ) -> tuple[list[SynthCaption], str | None]:
        order = list(captions)
        rng.shuffle(order)
        out, reasons = [], set()
        for caption in order:
            result = self.phrases.remove(caption, removed)
            if result.caption is None:
                reasons.add(result.reason)
                continue
            out.append(SynthCaption(result.caption, caption))
            if len(out) == self.config.captions_per_image:
                break
        if out:
            return out, None
        reason = REASON_NOTHING_LEFT if REASON_NOTHING_LEFT in reasons else REASON_NO_MATCH
        return [], f"caption_{reason}"

    def _caption_image(self, image: Image.Image) -> str:
        import torch

        from builders.engine.distributed import worker_device
        from builders.models.loaders import load_captioner

        if self._captioner is None:
            self._captioner = load_captioner(self.config.model, device=worker_device())
        model, processor = self._captioner
        inputs = processor(images=image, return_tensors="pt").to(model.device)
        with torch.inference_mode():
            ids = model.generate(**inputs, max_new_tokens=self.config.max_new_tokens, do_sample=False)
        return processor.batch_decode(ids, skip_special_tokens=True)[0].strip()
