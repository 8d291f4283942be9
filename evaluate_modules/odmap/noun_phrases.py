"""Noun-phrase chunking of captions and noun-phrase removal (Kim et al., 2023, §3.1, §3.2).

Pipeline per caption: NLTK tokenisation (``word_tokenize(text, preserve_line=True)``, which needs
no ``punkt`` data) -> ``pos_tag`` with NLTK's averaged perceptron tagger -> ``RegexpParser`` with
`NP_GRAMMAR`. Results are cached per unique caption (`NounPhraseCache`): a gallery with repeated
captions is tagged once per distinct string.

The noun-phrase grammar (Penn Treebank tags), applied rule by rule:

1. Determined NP: optional predeterminer, one or more determiners / possessive pronouns /
   numbers, optional adverbs, then modifiers (adjectives, participles, numbers) and one or more
   nouns, optionally followed by a possessive and another noun group:
   "Two dogs", "a very large elephant", "his tennis racket", "a parked car", "a man's dog".
2. Bare NP: adjectives / numbers then nouns, with the same possessive extension:
   "red buses", "people", "hot dogs".

Participles are accepted only *before* the nouns, so "a man holding umbrellas" is chunked as
"a man" + "umbrellas", not as one phrase. Pronouns such as "he" are not noun phrases
(the COCO table's "someone", "everyone" are tagged as nouns by the tagger).

`remove_noun_phrases` deletes every noun phrase that matches a removed class (match(c, n), see
`class_match`) and detokenises the rest with NLTK's Treebank detokeniser (no space before punctuation). Dangling commas / semicolons / colons left in front of
other punctuation or at either end are dropped. It returns None when no noun phrase matched
(`REASON_NO_MATCH`) or when no content word (noun, verb, adjective, adverb, number) would remain
(`REASON_NOTHING_LEFT`); `remove_noun_phrases_with_reason` tells the caller which, so the caller
can count drop reasons.

Example (pre-tagged, so it runs without a tagger):
    >>> chunk_tagged([("Two", "CD"), ("dogs", "NNS"), ("fighting", "VBG"), ("over", "IN"),
    ...               ("a", "DT"), ("frisbee", "NN")])
    ((0, 2), (4, 6))
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Protocol, Union

import nltk
from nltk.tokenize.treebank import TreebankWordDetokenizer

from .class_match import ClassMatcher, TableLike

logger = logging.getLogger(__name__)

__all__ = [
    "NP_GRAMMAR",
    "REASON_NO_MATCH",
    "REASON_NOTHING_LEFT",
    "ChunkedCaption",
    "NounPhraseCache",
    "NpRemoval",
    "DOWNLOAD_COMMAND",
    "TAGGER_DIR",
    "TaggerDataMissing",
    "ensure_tagger",
    "chunk_captions",
    "chunk_tagged",
    "default_tagger",
    "noun_phrases",
    "remove_noun_phrases",
    "remove_noun_phrases_with_reason",
    "tokenize",
]

NP_GRAMMAR = r"""
NP: {<PDT>?<DT|PRP\$|WP\$|CD>+<RB.*>*<JJ.*|VBN|VBG|CD>*<NN.*>+(<POS><JJ.*|VBN|VBG>*<NN.*>+)?}
    {<JJ.*|CD>*<NN.*>+(<POS><JJ.*|VBN|VBG>*<NN.*>+)?}
"""

REASON_NO_MATCH = "no_matching_noun_phrase"
REASON_NOTHING_LEFT = "nothing_left_after_removal"

_CONTENT_TAG = re.compile(r"^(NN|VB|JJ|RB|CD)")
_DANGLING = {",", ";", ":"}
_PUNCT_RE = re.compile(r"^[^\w\s]+$")

TAGGER_DIR = "taggers/averaged_perceptron_tagger_eng"
DOWNLOAD_COMMAND = "python -m nltk.downloader averaged_perceptron_tagger_eng"


class TaggerDataMissing(LookupError):
    """NLTK's POS tagger data is not installed; the message gives the one download command."""


class Tagger(Protocol):
    def tag(self, tokens: list[str]) -> list[tuple[str, str]]: ...


def tokenize(text: str) -> list[str]:
    """NLTK word tokenisation that needs no `punkt` data (one caption = one line)."""
    return nltk.word_tokenize(text, preserve_line=True)


def ensure_tagger() -> None:
    """Fail early, with the fix, when `nltk.pos_tag` has no tagger data."""
    try:
        nltk.data.find(TAGGER_DIR + "/")
    except LookupError:
        raise TaggerDataMissing(
            "NLTK's POS tagger data (averaged_perceptron_tagger_eng) is missing; download it once "
            f"with `{DOWNLOAD_COMMAND}` (or set NLTK_DATA to a folder holding {TAGGER_DIR})"
        ) from None


@lru_cache(maxsize=1)
def default_tagger() -> Tagger:
    """The tagger `nltk.pos_tag` uses (loaded once), with a clear error when its data is missing."""
    from nltk.tag.perceptron import PerceptronTagger

    ensure_tagger()
    return PerceptronTagger()


@lru_cache(maxsize=1)
def _parser() -> nltk.RegexpParser:
    return nltk.RegexpParser(NP_GRAMMAR)


@lru_cache(maxsize=1)
def _detokenizer() -> TreebankWordDetokenizer:
    return TreebankWordDetokenizer()


def chunk_tagged(tagged: Sequence[tuple[str, str]]) -> tuple[tuple[int, int], ...]:
    """Token spans [start, end) of the noun phrases of a POS-tagged token list."""
    if not tagged:
        return ()
    tree = _parser().parse(list(tagged))
    spans: list[tuple[int, int]] = []
    pos = 0
    for child in tree:
        if isinstance(child, nltk.Tree):
            n = len(child.leaves())
            if child.label() == "NP":
                spans.append((pos, pos + n))
            pos += n
        else:
            pos += 1
    return tuple(spans)


def _join(tokens: Sequence[str]) -> str:
    """Readable text of a noun phrase (no space before clitics and punctuation)."""
    out = ""
    for i, tok in enumerate(tokens):
        glue = i > 0 and not (tok.startswith("'") or tok == "n't" or _PUNCT_RE.match(tok))
        out += (" " if glue else "") + tok
    return out


@dataclass(frozen=True)
class ChunkedCaption:
    """A tokenised, tagged caption and the token spans [start, end) of its noun phrases."""

    tokens: tuple[str, ...]
    tags: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]

    @property
    def noun_phrases(self) -> tuple[str, ...]:
        return tuple(_join(self.tokens[a:b]) for a, b in self.spans)

    def to_json(self) -> list:
        return [list(self.tokens), list(self.tags), [list(s) for s in self.spans]]

    @classmethod
    def from_json(cls, obj: list) -> "ChunkedCaption":
        tokens, tags, spans = obj
        return cls(tuple(tokens), tuple(tags), tuple((int(a), int(b)) for a, b in spans))


def chunk_captions(captions: Sequence[str], tagger: Tagger | None = None) -> list[ChunkedCaption]:
    """Tokenise, tag and chunk several captions (the tagger is loaded once)."""
    for i, c in enumerate(captions):
        if not isinstance(c, str):
            raise ValueError(f"caption {i} is {type(c).__name__}, expected a string: {c!r}")
    tagger = tagger or default_tagger()
    out = []
    for caption in captions:
        tokens = tokenize(caption)
        tagged = tagger.tag(tokens) if tokens else []
        out.append(ChunkedCaption(tuple(tokens), tuple(t for _, t in tagged), chunk_tagged(tagged)))
    return out


def noun_phrases(caption: str, tagger: Tagger | None = None) -> tuple[str, ...]:
    """The noun phrases of one caption, e.g. ("Two dogs", "a frisbee")."""
    return chunk_captions([caption], tagger)[0].noun_phrases


class NounPhraseCache:
    """Chunking results per unique caption, so each distinct string is tagged once.

    `get_many` tags only the captions it has not seen. `save` / `load` keep the cache on disk
    (JSON) so a large gallery is chunked once per machine.
    """

    def __init__(self, tagger: Tagger | None = None) -> None:
        self._tagger = tagger
        self._entries: dict[str, ChunkedCaption] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, caption: object) -> bool:
        return caption in self._entries

    def get(self, caption: str) -> ChunkedCaption:
        return self.get_many([caption])[0]

    def get_many(self, captions: Sequence[str]) -> list[ChunkedCaption]:
        missing = list(dict.fromkeys(c for c in captions if c not in self._entries))
        if missing:
            for caption, chunked in zip(missing, chunk_captions(missing, self._tagger), strict=True):
                self._entries[caption] = chunked
        return [self._entries[c] for c in captions]

    def noun_phrases(self, caption: str) -> tuple[str, ...]:
        return self.get(caption).noun_phrases

    def save(self, path: Union[str, os.PathLike]) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            json.dump({"grammar": NP_GRAMMAR, "entries": {c: e.to_json() for c, e in self._entries.items()}}, f)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Union[str, os.PathLike], tagger: Tagger | None = None) -> "NounPhraseCache":
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        cache = cls(tagger)
        if data.get("grammar") != NP_GRAMMAR:
            logger.warning("%s was built with another NP grammar; ignoring it", path)
            return cache
        cache._entries = {c: ChunkedCaption.from_json(e) for c, e in data["entries"].items()}
        return cache


@dataclass(frozen=True)
class NpRemoval:
    """Result of noun-phrase removal: the new caption or None with the reason."""

    caption: str | None
    reason: str | None
    removed_phrases: tuple[str, ...]


@lru_cache(maxsize=8)
def _coco_matcher() -> ClassMatcher:
    return ClassMatcher()


def _as_matcher(table: TableLike | ClassMatcher) -> ClassMatcher:
    if isinstance(table, ClassMatcher):
        return table
    if table is None:
        return _coco_matcher()
    return ClassMatcher(table)


def _clean_punctuation(tokens: list[str]) -> list[str]:
    out: list[str] = []
    for i, tok in enumerate(tokens):
        if tok in _DANGLING:
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if not out or nxt is None or _PUNCT_RE.match(nxt):
                continue
        out.append(tok)
    return out


def remove_noun_phrases_with_reason(
    caption: str,
    classes: Iterable[str],
    table: TableLike | ClassMatcher = None,
    *,
    cache: NounPhraseCache | None = None,
) -> NpRemoval:
    """Delete every noun phrase of `caption` that matches one of `classes` (paper §3.1)."""
    matcher = _as_matcher(table)
    class_names = list(classes)
    if not class_names:
        raise ValueError("remove_noun_phrases needs at least one class to remove")
    cols = matcher.class_indices(class_names)  # ValueError on unknown classes
    chunked = cache.get(caption) if cache is not None else chunk_captions([caption])[0]
    drop: set[int] = set()
    removed: list[str] = []
    for (a, b), phrase in zip(chunked.spans, chunked.noun_phrases, strict=True):
        if matcher.phrase_vector(phrase)[cols].any():
            drop.update(range(a, b))
            removed.append(phrase)
    if not removed:
        return NpRemoval(None, REASON_NO_MATCH, ())
    keep = [i for i in range(len(chunked.tokens)) if i not in drop]
    if not any(_CONTENT_TAG.match(chunked.tags[i]) for i in keep):
        return NpRemoval(None, REASON_NOTHING_LEFT, tuple(removed))
    tokens = _clean_punctuation([chunked.tokens[i] for i in keep])
    text = _detokenizer().detokenize(tokens).strip()
    return NpRemoval(text, None, tuple(removed))


def remove_noun_phrases(
    caption: str,
    classes: Iterable[str],
    table: TableLike | ClassMatcher = None,
    *,
    cache: NounPhraseCache | None = None,
) -> str | None:
    """`caption` without the noun phrases that match `classes`, or None (no match / nothing left).

    Example: "Two dogs fighting over a frisbee", ["frisbee"] -> "Two dogs fighting over".
    """
    return remove_noun_phrases_with_reason(caption, classes, table, cache=cache).caption
