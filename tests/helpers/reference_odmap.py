"""Brute-force reference implementations for the ODmAP@k tests (test-only, deliberately slow).

Everything here follows builders/decorrelation/METHOD.md §4 / §5 literally with plain Python loops, independently of the
vectorised code in `counterfactory_metrics.odmap.odmap_scores` and the n-gram lookup in `counterfactory_metrics.odmap.class_match`:
regex whole-word matching, a per-query loop over the ranked captions, and AP@k summed term by term.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

_IRREGULAR = {
    "child": "children",
    "mouse": "mice",
    "goose": "geese",
    "foot": "feet",
    "tooth": "teeth",
    "man": "men",
    "woman": "women",
    "person": "people",
}


def _forms(word: str) -> list[str]:
    """The word and its simple plurals (the rules documented in counterfactory_metrics.odmap.class_match)."""
    word = word.lower()
    head, _, last = word.rpartition(" ")
    lasts = [last, last + "s"]
    if last[-1:] in ("s", "x", "z", "o") or last.endswith(("ch", "sh")):
        lasts.append(last + "es")
    if len(last) > 1 and last.endswith("y") and last[-2] not in "aeiou":
        lasts.append(last[:-1] + "ies")
    if last.endswith("fe"):
        lasts.append(last[:-2] + "ves")
    elif last.endswith("f"):
        lasts.append(last[:-1] + "ves")
    if last in _IRREGULAR:
        lasts.append(_IRREGULAR[last])
    return [(head + " " + form) if head else form for form in lasts]


def reference_match(class_name: str, noun_phrase: str, table: Mapping[str, Iterable[str]]) -> bool:
    """match(c, n) by regex: the class name or a related word occurs as whole word(s) in n."""
    if class_name not in table:
        raise ValueError(f"unknown class {class_name!r}")
    text = noun_phrase.lower()
    for word in [class_name, *table[class_name]]:
        for form in _forms(word):
            pattern = r"(?<![a-z0-9])" + r"[^a-z0-9]+".join(map(re.escape, form.split())) + r"(?![a-z0-9])"
            if re.search(pattern, text):
                return True
    return False


def reference_ap_at_k(rel: Sequence[int], k: int) -> float:
    """AP@k = (1/k) * sum_{i=1..k} rel(i) * P(i), P(i) = (1/i) * sum_{j=1..i} rel(j)."""
    if k > len(rel):
        raise ValueError("k exceeds the ranking")
    total = 0.0
    for i in range(1, k + 1):
        precision_i = sum(rel[:i]) / i
        total += rel[i - 1] * precision_i
    return total / k


def reference_is_correct(mentioned: set[str], removed: set[str], present: set[str], require_present: str) -> int:
    if mentioned & removed:
        return 0
    if require_present == "any":
        return int(bool(mentioned & present))
    return int(present <= mentioned)


def reference_odmap_from_rankings(
    rankings: Sequence[Sequence[int]],
    gallery_mentioned: Sequence[set[str]],
    removed: Sequence[set[str]],
    present: Sequence[set[str]],
    k_values: Sequence[int],
    require_present: str = "any",
) -> dict[int, float]:
    """ODmAP@k from gallery indices and per-caption sets of mentioned classes."""
    out = {}
    for k in k_values:
        aps = []
        for q, ranking in enumerate(rankings):
            rel = [
                reference_is_correct(gallery_mentioned[g], removed[q], present[q], require_present) for g in ranking
            ]
            aps.append(reference_ap_at_k(rel, k))
        out[k] = sum(aps) / len(aps)
    return out


def reference_odmap_from_captions(
    retrieved_captions: Sequence[Sequence[str]],
    removed: Sequence[Iterable[str]],
    present: Sequence[Iterable[str]],
    k_values: Sequence[int],
    require_present: str,
    table: Mapping[str, Iterable[str]],
    noun_phrases_of: Callable[[str], Sequence[str]],
) -> dict[int, float]:
    """ODmAP@k from caption texts: per query, per caption, chunk and match every class by regex."""
    out = {}
    for k in k_values:
        aps = []
        for q, ranking in enumerate(retrieved_captions):
            rel = []
            for caption in ranking:
                phrases = noun_phrases_of(caption)
                mentioned = {c for c in table if any(reference_match(c, n, table) for n in phrases)}
                rel.append(reference_is_correct(mentioned, set(removed[q]), set(present[q]), require_present))
            aps.append(reference_ap_at_k(rel, k))
        out[k] = sum(aps) / len(aps)
    return out


def reference_topk(query: np.ndarray, gallery: np.ndarray, k: int) -> np.ndarray:
    """Top-k by the full score matrix; ties broken by the lower gallery index (stable sort)."""
    scores = query.astype(np.float32) @ gallery.astype(np.float32).T
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


class DictTagger:
    """A deterministic POS tagger for tests (no NLTK data): a word -> Penn tag lookup."""

    def __init__(self, tags: Mapping[str, str]) -> None:
        self.tags = {w.lower(): t for w, t in tags.items()}
        self.calls = 0
        self.tokens_tagged = 0

    def tag(self, tokens: list[str]) -> list[tuple[str, str]]:
        self.calls += 1
        self.tokens_tagged += len(tokens)
        return [(t, self.tags.get(t.lower(), "." if not t.isalnum() else "NN")) for t in tokens]


#: A small caption vocabulary with fixed tags, used to generate random captions in tests.
VOCAB = {
    "DT": ["a", "the", "an"],
    "CD": ["two", "three"],
    "JJ": ["red", "small", "wooden", "young"],
    "NN": [
        "dog",
        "puppy",
        "man",
        "woman",
        "frisbee",
        "disc",
        "table",
        "desk",
        "grass",
        "kitchen",
        "bear",
        "teddy",
        "board",
        "skateboard",
        "cat",
        "kitten",
        "street",
        "field",
        "ski",
        "hot",
        "sky",
        "knife",
        "child",
        "phone",
        "truck",
        "car",
        "glass",
        "bus",
    ],
    "NNS": [
        "dogs",
        "puppies",
        "men",
        "women",
        "frisbees",
        "tables",
        "boards",
        "cats",
        "skis",
        "skies",
        "knives",
        "children",
        "people",
        "buses",
        "glasses",
        "kids",
    ],
    "VBG": ["sitting", "holding", "playing", "fighting", "riding"],
    "IN": ["on", "with", "near", "over", "in"],
    "CC": ["and"],
}
VOCAB_TAGS = {w: t for t, words in VOCAB.items() for w in words}


def random_caption(rng: np.random.Generator) -> str:
    def pick(tag: str) -> str:
        words = VOCAB[tag]
        return words[int(rng.integers(len(words)))]

    def np_() -> list[str]:
        out = [pick(["DT", "CD"][int(rng.integers(2))])]
        if rng.random() < 0.4:
            out.append(pick("JJ"))
        out.append(pick("NNS" if out[0] in VOCAB["CD"] else "NN"))
        return out

    words = np_() + [pick("VBG"), pick("IN")] + np_()
    if rng.random() < 0.4:
        words += [pick("CC")] + np_()
    if rng.random() < 0.5:
        words.append(".")
    text = " ".join(words).replace(" .", ".")
    return text[0].upper() + text[1:]
