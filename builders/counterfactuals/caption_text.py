"""The words of a caption: NLTK tokens, their character spans, one-word edits and a cheap English
check (builders/counterfactuals/METHOD.md §1). The caption stage edits through these, and the
caption-pair tables check imported pairs with the same ones, so "one word changed" means the same
thing everywhere.

Tokenisation is `word_tokenize(text, preserve_line=True)` (no `punkt` data needed) with a
sentence-ending period inside a caption split off its word, as the reference's sentence split
does (`caption_tokens`).
"""

from __future__ import annotations

from typing import Sequence

from nltk.tokenize import NLTKWordTokenizer

from counterfactory_metrics.odmap.noun_phrases import tokenize

#: Words nearly every English caption has at least one of (a cheap language check, no model).
_FUNCTION_WORDS = frozenset(
    "a an the of on in at with and or to is are be by for from near next into onto over under "
    "its his her their this that there some two three while as up down out".split()
)


def count_words(tokens: Sequence[str]) -> int:
    return sum(any(ch.isalpha() for ch in tok) for tok in tokens)


def looks_english(tokens: Sequence[str]) -> bool:
    """A cheap check: at least 90% of letters are ASCII, and a caption of 4+ words has at least
    one common English function word. (No language-ID model: captions are short and plain.)"""
    letters = [ch for tok in tokens for ch in tok if ch.isalpha()]
    if not letters:
        return True  # nothing to judge: too short for the stage anyway
    if sum(ch.isascii() for ch in letters) < 0.9 * len(letters):
        return False
    words = [tok.lower() for tok in tokens if any(ch.isalpha() for ch in tok)]
    return len(words) < 4 or any(w in _FUNCTION_WORDS for w in words)


#: `tokenize` is `word_tokenize(preserve_line=True)`, i.e. this tokenizer's `tokenize`.
_SPANS = NLTKWordTokenizer()


def _inner_periods(tokens: Sequence[str]) -> set[int]:
    """Positions of words that carry a sentence-ending period inside the caption (`bike.`
    followed by more tokens); abbreviations with inner dots (`U.S.`) are left alone."""
    return {
        k
        for k, tok in enumerate(tokens[:-1])
        if len(tok) > 1 and tok.endswith(".") and "." not in tok[:-1] and any(ch.isalpha() for ch in tok)
    }


def caption_tokens(text: str) -> list[str]:
    """`tokenize(text)` with inner sentence periods split off their words (module docstring)."""
    raw = tokenize(text)
    cut = _inner_periods(raw)
    return [part for k, tok in enumerate(raw) for part in ((tok[:-1], ".") if k in cut else (tok,))]


def token_spans(text: str, tokens: Sequence[str]) -> list[tuple[int, int]] | None:
    """Character span of each of `caption_tokens(text)`'s tokens (NLTK's own alignment, which
    maps its rewritten quotes back to the source characters); None when it cannot align them."""
    try:
        raw_spans = list(_SPANS.span_tokenize(text))
    except ValueError:
        return None
    raw = tokenize(text)
    if len(raw_spans) != len(raw):
        return None
    cut = _inner_periods(raw)
    spans: list[tuple[int, int]] = []
    for k, (a, b) in enumerate(raw_spans):
        if k in cut:
            if text[b - 1] != ".":
                return None
            spans += [(a, b - 1), (b - 1, b)]
        else:
            spans.append((a, b))
    return spans if len(spans) == len(tokens) else None


def edit_at(text: str, span: tuple[int, int], word: str) -> str:
    """`text` with exactly the characters of `span` replaced by `word`."""
    return text[: span[0]] + word + text[span[1] :]


def changed_words(original: str, edited: str) -> list[int] | None:
    """Positions of the `caption_tokens` in which two captions differ; None when they have
    different token counts. The stage's own edits (step 3: same token count, one token swapped)
    change exactly one position, so `[i]` is a one-word edit and `[]` no edit at all."""
    a, b = caption_tokens(original), caption_tokens(edited)
    if len(a) != len(b):
        return None
    return [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
