"""Noun-phrase chunking, the per-caption cache and np_removal (builders/decorrelation/METHOD.md §3)."""

from __future__ import annotations

import doctest

import pytest

import counterfactory_metrics.odmap.noun_phrases as noun_phrases_module
from counterfactory_metrics.odmap.class_match import ClassMatcher
from counterfactory_metrics.odmap.noun_phrases import (
    REASON_NO_MATCH,
    REASON_NOTHING_LEFT,
    NounPhraseCache,
    chunk_captions,
    chunk_tagged,
    noun_phrases,
    remove_noun_phrases,
    remove_noun_phrases_with_reason,
)

from helpers.reference_odmap import VOCAB_TAGS, DictTagger

TAGS = {
    **VOCAB_TAGS,
    "fighting": "VBG",
    "frisbee": "NN",
    "'s": "POS",
    "very": "RB",
    "large": "JJ",
    "elephant": "NN",
    "his": "PRP$",
    "tennis": "NN",
    "racket": "NN",
    "parked": "VBN",
    "umbrellas": "NNS",
    "is": "VBZ",
    "all": "PDT",
}


def _phrases(tagged: list[tuple[str, str]]) -> list[str]:
    return [" ".join(w for w, _ in tagged[a:b]) for a, b in chunk_tagged(tagged)]


def test_docstring_examples():
    result = doctest.testmod(noun_phrases_module, raise_on_error=False)
    assert result.attempted >= 1 and result.failed == 0


@pytest.mark.parametrize(
    "tagged, expected",
    [
        ("Two/CD dogs/NNS fighting/VBG over/IN a/DT frisbee/NN", ["Two dogs", "a frisbee"]),
        ("a/DT very/RB large/JJ elephant/NN", ["a very large elephant"]),
        ("his/PRP$ tennis/NN racket/NN", ["his tennis racket"]),
        ("a/DT parked/VBN car/NN", ["a parked car"]),
        ("a/DT man/NN 's/POS dog/NN", ["a man 's dog"]),
        # participles only before the nouns: "a man holding umbrellas" is two phrases
        ("a/DT man/NN holding/VBG red/JJ umbrellas/NNS", ["a man", "red umbrellas"]),
        ("people/NNS on/IN all/PDT the/DT hot/JJ dogs/NNS", ["people", "all the hot dogs"]),
        ("he/PRP is/VBZ sitting/VBG", []),
        ("", []),
    ],
)
def test_np_grammar_on_pre_tagged_input(tagged, expected):
    pairs = [tuple(t.rsplit("/", 1)) for t in tagged.split()]
    assert _phrases(pairs) == expected


def test_spec_example_with_a_fixed_tagger():
    cache = NounPhraseCache(DictTagger(TAGS))
    caption = "Two dogs fighting over a frisbee"
    assert cache.noun_phrases(caption) == ("Two dogs", "a frisbee")
    assert remove_noun_phrases(caption, ["frisbee"], cache=cache) == "Two dogs fighting over"
    assert remove_noun_phrases(caption + ".", ["frisbee"], cache=cache) == "Two dogs fighting over."
    assert remove_noun_phrases(caption, ["dog"], cache=cache) == "fighting over a frisbee"


@pytest.mark.parametrize(
    "caption, classes, expected",
    [
        # no space before punctuation, dangling commas dropped
        ("A frisbee, a cat and two dogs on the grass.", ["frisbee"], "a cat and two dogs on the grass."),
        ("A cat, a frisbee, on the grass.", ["frisbee"], "A cat, on the grass."),
        ("A man's dog is sitting on the grass.", ["person"], "is sitting on the grass."),
        # every matching phrase goes, for every removed class
        ("A man with a dog near a woman.", ["person"], "with a dog near."),
        ("A man with a dog near a woman.", ["person", "dog"], None),  # only prepositions left
    ],
)
def test_removal_detokenizes_and_cleans_punctuation(caption, classes, expected):
    cache = NounPhraseCache(DictTagger(TAGS))
    assert remove_noun_phrases(caption, classes, cache=cache) == expected


def test_removal_reasons_are_reported():
    cache = NounPhraseCache(DictTagger(TAGS))
    no_match = remove_noun_phrases_with_reason("A dog on the grass", ["cat"], cache=cache)
    assert (no_match.caption, no_match.reason, no_match.removed_phrases) == (None, REASON_NO_MATCH, ())
    nothing = remove_noun_phrases_with_reason("A frisbee.", ["frisbee"], cache=cache)
    assert (nothing.caption, nothing.reason) == (None, REASON_NOTHING_LEFT)
    assert nothing.removed_phrases == ("A frisbee",)
    ok = remove_noun_phrases_with_reason("Two dogs fighting over a frisbee", ["frisbee"], cache=cache)
    assert ok.reason is None and ok.removed_phrases == ("a frisbee",)


def test_removal_with_a_user_table():
    cache = NounPhraseCache(DictTagger(TAGS))
    table = {"animal": ["dog", "cat"], "toy": ["frisbee"]}
    assert (
        remove_noun_phrases("Two dogs fighting over a frisbee", ["animal"], table, cache=cache)
        == "fighting over a frisbee"
    )
    assert (
        remove_noun_phrases("Two dogs fighting over a frisbee", ["toy"], ClassMatcher(table), cache=cache)
        == "Two dogs fighting over"
    )


def test_removal_bad_inputs_raise():
    cache = NounPhraseCache(DictTagger(TAGS))
    with pytest.raises(ValueError, match="unicorn"):
        remove_noun_phrases("A dog", ["unicorn"], cache=cache)
    with pytest.raises(ValueError, match="at least one class"):
        remove_noun_phrases("A dog", [], cache=cache)
    with pytest.raises(ValueError, match="expected a string"):
        chunk_captions([None], DictTagger(TAGS))  # type: ignore[list-item]


def test_cache_tags_each_unique_caption_once(tmp_path):
    tagger = DictTagger(TAGS)
    cache = NounPhraseCache(tagger)
    captions = ["A dog on the grass", "A cat", "A dog on the grass", "A cat", "Two dogs"]
    first = cache.get_many(captions)
    assert tagger.calls == 3 and len(cache) == 3
    assert first[0] is first[2]
    cache.get_many(captions)
    cache.get("A cat")
    assert tagger.calls == 3
    assert [c.noun_phrases for c in first] == [
        ("A dog", "the grass"),
        ("A cat",),
        ("A dog", "the grass"),
        ("A cat",),
        ("Two dogs",),
    ]
    path = tmp_path / "np_cache.json"
    cache.save(path)
    loaded = NounPhraseCache.load(path, tagger)
    assert len(loaded) == 3 and loaded.get("A cat") == cache.get("A cat")
    assert tagger.calls == 3


# ---------------------------------------------------------------- with NLTK's perceptron tagger


def test_spec_example_with_the_nltk_tagger(nltk_data_dir):
    caption = "Two dogs fighting over a frisbee"
    assert noun_phrases(caption) == ("Two dogs", "a frisbee")
    assert remove_noun_phrases(caption, ["frisbee"]) == "Two dogs fighting over"
    assert remove_noun_phrases("Two dogs fighting over a frisbee.", ["frisbee"]) == ("Two dogs fighting over.")


def test_nltk_tagger_chunks_typical_captions(nltk_data_dir):
    assert noun_phrases("A man riding a horse on a beach.") == ("A man", "a horse", "a beach")
    assert remove_noun_phrases("A man riding a horse on a beach.", ["person"]) == ("riding a horse on a beach.")
    assert remove_noun_phrases("A cat sitting on a table.", ["dog"]) is None
