"""match(c, n): does a noun phrase mention an object class? (Kim et al., 2023, §3.1, Appendix A)

A noun phrase n matches class c when n contains, as whole words and case-insensitively, the class
name or one of the class's related words from a matching table. The COCO table below is the
paper's Table 4 (Appendix A), verbatim; all 80 COCO classes are known, and a class without
listed words matches only its own name. Other datasets pass their own table (a dict
or a JSON file ``{"class": ["related", "words"], ...}``; its keys are the known classes).

Matching rules (documented choices where the paper is silent):

- Text is lower-cased and split into word tokens ``[a-z0-9]+`` (so "man's" -> "man", "s" and
  "t-shirt" -> "t", "shirt"); a word, or a multi-word name such as "dining table", matches when its
  tokens occur as a contiguous run of tokens of the noun phrase.
- Simple plurals of every listed word (and of the class name) also match; for a multi-word name
  the last word is pluralised ("traffic lights"). Simple plurals are: +s; +es after s/x/z/ch/sh/o
  (so "ski" does not match "skies"); consonant+y -> ies;
  f/fe -> ves (knife -> knives); plus a small irregular list (child -> children, mouse -> mice,
  goose -> geese, foot -> feet, tooth -> teeth, man -> men, woman -> women, person -> people).
- Lookup is by token n-grams in a dict from word form to class indices, so matching a noun phrase
  against all classes costs O(tokens), not O(classes).

Example:
    >>> m = ClassMatcher()
    >>> m.match("person", "Two young boys")
    True
    >>> m.match("dining table", "a wooden tables")
    True
    >>> m.match("dog", "a hot dog")
    True
    >>> m.match("dog", "a dogma")
    False
    >>> m.mentions(["a frisbee", "two puppies"], ["dog", "frisbee", "cat"]).tolist()
    [True, True, False]
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Union

import numpy as np

__all__ = [
    "COCO_CLASSES",
    "COCO_TABLE",
    "ClassMatcher",
    "TableLike",
    "load_table",
    "word_forms",
    "words_of",
]

#: The 80 COCO object classes, in COCO category-id order.
COCO_CLASSES: tuple[str, ...] = (
    "person",
    "bicycle",
    "car",
    "motorcycle",
    "airplane",
    "bus",
    "train",
    "truck",
    "boat",
    "traffic light",
    "fire hydrant",
    "stop sign",
    "parking meter",
    "bench",
    "bird",
    "cat",
    "dog",
    "horse",
    "sheep",
    "cow",
    "elephant",
    "bear",
    "zebra",
    "giraffe",
    "backpack",
    "umbrella",
    "handbag",
    "tie",
    "suitcase",
    "frisbee",
    "skis",
    "snowboard",
    "sports ball",
    "kite",
    "baseball bat",
    "baseball glove",
    "skateboard",
    "surfboard",
    "tennis racket",
    "bottle",
    "wine glass",
    "cup",
    "fork",
    "knife",
    "spoon",
    "bowl",
    "banana",
    "apple",
    "sandwich",
    "orange",
    "broccoli",
    "carrot",
    "hot dog",
    "pizza",
    "donut",
    "cake",
    "chair",
    "couch",
    "potted plant",
    "bed",
    "dining table",
    "toilet",
    "tv",
    "laptop",
    "mouse",
    "remote",
    "keyboard",
    "cell phone",
    "microwave",
    "oven",
    "toaster",
    "sink",
    "refrigerator",
    "book",
    "clock",
    "vase",
    "scissors",
    "teddy bear",
    "hair drier",
    "toothbrush",
)

# Kim et al. (2023), Appendix A, Table 4, verbatim. The class name itself always counts and is
# not repeated.
_COCO_RELATED: dict[str, tuple[str, ...]] = {
    "person": (
        "man",
        "woman",
        "player",
        "child",
        "girl",
        "boy",
        "boys",
        "people",
        "lady",
        "guy",
        "kid",
        "kids",
        "surfer",
        "cowboy",
        "cowboys",
        "adult",
        "adults",
        "cop",
        "soldier",
        "police",
        "catcher",
        "pitcher",
        "jockey",
        "baby",
        "men",
        "women",
        "biker",
        "spectator",
        "rider",
        "batter",
        "gay",
        "anyone",
        "someone",
        "reporter",
        "somebody",
        "anybody",
        "everyone",
        "worker",
        "workers",
    ),
    "airplane": ("plane", "jet", "aircraft"),
    "bicycle": ("bike", "biking", "cycling"),
    "motorcycle": ("motor",),
    "bus": ("trolley",),
    "car": ("van", "taxi", "trunk", "truck", "suv"),
    "train": ("tram", "subway"),
    "traffic light": ("traffic",),
    "stop sign": ("sign",),
    "parking meter": ("meter",),
    "fire hydrant": ("hydrant", "hydrate", "hydra"),
    "bird": ("beak", "duck", "goose", "gull", "pigeon", "chicken", "penguin"),
    "cat": ("kitty", "kitten"),
    "dog": ("puppy", "puppies"),
    "sheep": ("lamb",),
    "horse": ("pony", "foal"),
    "cow": ("cattle", "oxen", "ox", "herd", "calves", "bull", "calf"),
    "handbag": ("bag",),
    "suitcase": ("bag", "luggage", "case"),
    "frisbee": ("disc", "disk", "frisby"),
    "sports ball": ("ball",),
    "baseball bat": ("bat",),
    "baseball glove": ("glove",),
    "skateboard": ("board", "skate"),
    "surfboard": ("board",),
    "snowboard": ("board",),
    "skis": ("ski",),
    "tennis racket": ("racket", "racquet"),
    "wine glass": ("glass", "wine", "beverage"),
    "bottle": ("thermos", "flask", "beer", "beverage"),
    "cup": ("glass", "mug", "beverage", "coffee", "tea"),
    "spoon": ("silverware",),
    "donut": ("doughnut", "dough"),
    "cake": ("dessert", "frosting"),
    "dining table": ("desk", "table", "tables"),
    "chair": ("stool",),
    "potted plant": ("plant", "flower"),
    "vase": ("pot", "vase"),
    "tv": ("television", "screen"),
    "laptop": ("computer", "monitor", "screen"),
    "cell phone": ("phone",),
    "refrigerator": ("fridge",),
    "book": ("novel",),
    "scissors": ("scissor",),
    "toothbrush": ("brush",),
    "hair drier": ("drier",),
    "teddy bear": ("teddy", "toy", "bear", "doll"),
}

#: The COCO matching table: every COCO class -> its related words (empty when none are listed).
COCO_TABLE: dict[str, tuple[str, ...]] = {c: _COCO_RELATED.get(c, ()) for c in COCO_CLASSES}

_IRREGULAR_PLURALS = {
    "child": "children",
    "mouse": "mice",
    "goose": "geese",
    "foot": "feet",
    "tooth": "teeth",
    "man": "men",
    "woman": "women",
    "person": "people",
}
_TOKEN_RE = re.compile(r"[a-z0-9]+")
_VOWELS = set("aeiou")

TableLike = Union[Mapping[str, Iterable[str]], str, os.PathLike, None]


def words_of(text: str) -> list[str]:
    """Lower-cased word tokens of a text, as matching sees them."""
    return _TOKEN_RE.findall(text.lower())


def _plurals(word: str) -> set[str]:
    forms = {word + "s"}
    if word.endswith(("s", "x", "z", "ch", "sh", "o")):
        forms.add(word + "es")
    if len(word) > 1 and word.endswith("y") and word[-2] not in _VOWELS:
        forms.add(word[:-1] + "ies")
    if word.endswith("fe"):
        forms.add(word[:-2] + "ves")
    elif word.endswith("f"):
        forms.add(word[:-1] + "ves")
    if word in _IRREGULAR_PLURALS:
        forms.add(_IRREGULAR_PLURALS[word])
    return forms


def word_forms(word: str) -> set[tuple[str, ...]]:
    """Token tuples that count as an occurrence of `word` (itself and its simple plurals)."""
    tokens = words_of(word)
    if not tokens:
        return set()
    head, last = tuple(tokens[:-1]), tokens[-1]
    return {head + (form,) for form in {last, *_plurals(last)}}


def load_table(table: TableLike) -> dict[str, tuple[str, ...]]:
    """A validated matching table from a mapping, a JSON file path, or None (the COCO table)."""
    if table is None:
        return dict(COCO_TABLE)
    source = "matching table"
    if isinstance(table, (str, os.PathLike)):
        path = Path(table)
        source = str(path)
        try:
            table = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ValueError(f"{path}: matching table file not found") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(table, Mapping):
        raise ValueError(
            f"{source}: expected a mapping class name -> list of related words, got {type(table).__name__}"
        )
    if not table:
        raise ValueError(f"{source}: the table is empty; it must list at least one class")
    out: dict[str, tuple[str, ...]] = {}
    for cls, related in table.items():
        if not isinstance(cls, str) or not words_of(cls):
            raise ValueError(f"{source}: class name {cls!r} must be a non-empty string with letters")
        if isinstance(related, str) or not isinstance(related, Iterable):
            raise ValueError(f"{source}: related words of class {cls!r} must be a list of strings, got {related!r}")
        words = tuple(related)
        bad = [w for w in words if not isinstance(w, str) or not words_of(w)]
        if bad:
            raise ValueError(f"{source}: class {cls!r} has invalid related words {bad!r}")
        out[cls] = words
    return out


class ClassMatcher:
    """Whole-word, case-insensitive class <-> noun-phrase matching with a table.

    Args:
        table: class -> related words (a mapping, a path to a JSON file, or None for the paper's
            COCO table). Its keys are the known class names; asking about any other class raises
            ValueError.
    """

    def __init__(self, table: TableLike = None) -> None:
        self.table = load_table(table)
        self.class_names: tuple[str, ...] = tuple(self.table)
        self._index = {c: i for i, c in enumerate(self.class_names)}
        forms: dict[tuple[str, ...], set[int]] = {}
        for i, cls in enumerate(self.class_names):
            for word in (cls, *self.table[cls]):
                for form in word_forms(word):
                    forms.setdefault(form, set()).add(i)
        self._forms = {form: np.fromiter(sorted(ids), dtype=np.int64) for form, ids in forms.items()}
        self._max_len = max(len(f) for f in self._forms)

    def __repr__(self) -> str:
        return f"ClassMatcher({len(self.class_names)} classes)"

    def class_indices(self, class_names: Iterable[str]) -> np.ndarray:
        """Indices into `self.class_names`; ValueError naming any unknown class."""
        names = list(class_names)
        unknown = [c for c in names if c not in self._index]
        if unknown:
            raise ValueError(
                f"unknown class name(s) {sorted(set(unknown))!r}: not in the matching table "
                f"({len(self.class_names)} classes, e.g. {list(self.class_names[:3])!r}); "
                "pass a table that lists them"
            )
        return np.fromiter((self._index[c] for c in names), dtype=np.int64, count=len(names))

    def _matched_ids(self, text: str) -> set[int]:
        tokens = words_of(text)
        ids: set[int] = set()
        for n in range(1, self._max_len + 1):
            for start in range(len(tokens) - n + 1):
                hit = self._forms.get(tuple(tokens[start : start + n]))
                if hit is not None:
                    ids.update(hit.tolist())
        return ids

    def phrase_vector(self, noun_phrase: str) -> np.ndarray:
        """Bool vector over all table classes: which classes `noun_phrase` matches."""
        out = np.zeros(len(self.class_names), dtype=bool)
        ids = self._matched_ids(noun_phrase)
        if ids:
            out[list(ids)] = True
        return out

    def match(self, class_name: str, noun_phrase: str) -> bool:
        """match(c, n) of the paper: True when the noun phrase mentions the class."""
        idx = int(self.class_indices([class_name])[0])
        return idx in self._matched_ids(noun_phrase)

    def match_matrix(self, noun_phrases: Sequence[str], class_names: Sequence[str]) -> np.ndarray:
        """Bool matrix [len(noun_phrases) x len(class_names)]: phrase i matches class j."""
        cols = self.class_indices(class_names)
        out = np.zeros((len(noun_phrases), len(cols)), dtype=bool)
        for i, phrase in enumerate(noun_phrases):
            out[i] = self.phrase_vector(phrase)[cols]
        return out

    def mentions(self, noun_phrases: Iterable[str], class_names: Sequence[str]) -> np.ndarray:
        """Bool vector [len(class_names)]: some noun phrase of the caption matches class j.

        `noun_phrases` are the noun phrases of one caption; the result is the caption's row of a
        gallery x class mention matrix.
        """
        cols = self.class_indices(class_names)
        ids: set[int] = set()
        for phrase in noun_phrases:
            ids |= self._matched_ids(phrase)
        full = np.zeros(len(self.class_names), dtype=bool)
        if ids:
            full[list(ids)] = True
        return full[cols]
