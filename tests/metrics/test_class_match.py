"""The builders/decorrelation/METHOD.md §4 class<->word table and match(c, n): exact table, whole words, plurals, errors."""

from __future__ import annotations

import doctest
import json

import numpy as np
import pytest

import counterfactory_metrics.odmap.class_match as class_match
from counterfactory_metrics.odmap.class_match import COCO_CLASSES, COCO_TABLE, ClassMatcher, load_table

from helpers.reference_odmap import VOCAB, reference_match

# builders/decorrelation/METHOD.md §4, copied verbatim.
PAPER_TABLE = """\
person: man, woman, player, child, girl, boy, boys, people, lady, guy, kid, kids, surfer, cowboy, cowboys, adult, adults, cop, soldier, police, catcher, pitcher, jockey, baby, men, women, biker, spectator, rider, batter, gay, anyone, someone, reporter, somebody, anybody, everyone, worker, workers
airplane: plane, jet, aircraft
bicycle: bike, biking, cycling
motorcycle: motor
bus: trolley
car: van, taxi, trunk, truck, suv
train: tram, subway
traffic light: traffic
stop sign: sign
parking meter: meter
fire hydrant: hydrant, hydrate, hydra
bird: beak, duck, goose, gull, pigeon, chicken, penguin
cat: kitty, kitten
dog: puppy, puppies
sheep: lamb
horse: pony, foal
cow: cattle, oxen, ox, herd, calves, bull, calf
handbag: bag
suitcase: bag, luggage, case
frisbee: disc, disk, frisby
sports ball: ball
baseball bat: bat
baseball glove: glove
skateboard: board, skate
surfboard: board
snowboard: board
skis: ski
tennis racket: racket, racquet
wine glass: glass, wine, beverage
bottle: thermos, flask, beer, beverage
cup: glass, mug, beverage, coffee, tea
spoon: silverware
donut: doughnut, dough
cake: dessert, frosting
dining table: desk, table, tables
chair: stool
potted plant: plant, flower
vase: pot, vase
tv: television, screen
laptop: computer, monitor, screen
cell phone: phone
refrigerator: fridge
book: novel
scissors: scissor
toothbrush: brush
hair drier: drier
teddy bear: teddy, toy, bear, doll
"""


def _parse_spec_table() -> dict[str, list[str]]:
    out = {}
    for line in PAPER_TABLE.strip().splitlines():
        cls, _, words = line.partition(":")
        out[cls.strip()] = [w.strip() for w in words.split(",")]
    return out


def test_coco_table_is_exactly_the_spec_table():
    spec = _parse_spec_table()
    assert len(COCO_CLASSES) == len(set(COCO_CLASSES)) == 80
    assert set(COCO_TABLE) == set(COCO_CLASSES)
    assert set(spec) <= set(COCO_CLASSES), set(spec) - set(COCO_CLASSES)
    for cls in COCO_CLASSES:
        assert list(COCO_TABLE[cls]) == spec.get(cls, []), cls


def test_docstring_examples():
    result = doctest.testmod(class_match, raise_on_error=False)
    assert result.attempted >= 5 and result.failed == 0


@pytest.mark.parametrize(
    "cls, phrase, expected",
    [
        ("person", "Two young boys", True),
        ("person", "A SURFER", True),  # case-insensitive
        ("person", "the children", True),  # irregular plural of a listed word
        ("person", "a superman costume", False),  # whole words only
        ("dog", "two puppies", True),
        ("dog", "a dogma", False),
        ("dog", "a hot dog", True),  # the class name itself always counts
        ("hot dog", "three hot dogs", True),  # multi-word name, plural of the last word
        ("hot dog", "a hot day", False),
        ("dining table", "a wooden table", True),
        ("dining table", "the dining tables", True),
        ("dining table", "a dining room", False),
        ("traffic light", "the traffic lights", True),
        ("traffic light", "heavy traffic", True),
        ("traffic light", "a light", False),  # only the whole name or a listed word
        ("skis", "a pair of skis", True),
        ("skis", "a ski", True),
        ("skis", "clear blue skies", False),  # "skies" is not a plural of "ski"
        ("knife", "two knives", True),
        ("bus", "red buses", True),
        ("wine glass", "two glasses", True),
        ("teddy bear", "a stuffed bear", True),
        ("bear", "a stuffed teddy", False),
        ("cat", "a kitten", True),
        ("cat", "a catalog", False),
        ("cell phone", "a man's phone", True),
        ("frisbee", "a t-shirt", False),
    ],
)
def test_match_examples(cls, phrase, expected):
    assert ClassMatcher().match(cls, phrase) is expected
    assert reference_match(cls, phrase, COCO_TABLE) is expected


def test_match_matrix_agrees_with_regex_reference_on_random_phrases():
    rng = np.random.default_rng(0)
    words = [w for ws in VOCAB.values() for w in ws] + [
        "traffic",
        "light",
        "lights",
        "dining",
        "room",
        "hot",
        "dogs",
        "tennis",
        "racket",
        "dogma",
        "superman",
        "catalog",
        "t-shirt",
        "man's",
        "Skies",
        "DOG",
        "Puppies",
        "oxen",
    ]
    phrases = [" ".join(words[i] for i in rng.integers(len(words), size=int(rng.integers(1, 5)))) for _ in range(400)]
    matcher = ClassMatcher()
    got = matcher.match_matrix(phrases, COCO_CLASSES)
    expected = np.array([[reference_match(c, p, COCO_TABLE) for c in COCO_CLASSES] for p in phrases])
    assert got.any()  # the vocabulary does hit classes
    mismatch = np.argwhere(got != expected)
    assert mismatch.size == 0, [(phrases[i], COCO_CLASSES[j]) for i, j in mismatch[:5]]


def test_mentions_is_any_over_the_noun_phrases():
    m = ClassMatcher()
    got = m.mentions(["a frisbee", "two puppies"], ["dog", "frisbee", "cat", "person"])
    assert got.tolist() == [True, True, False, False]
    assert m.mentions([], ["dog"]).tolist() == [False]
    assert m.mentions(["a dog"], []).shape == (0,)


def test_unknown_class_names_raise_naming_them():
    m = ClassMatcher()
    with pytest.raises(ValueError, match="unicorn"):
        m.match("unicorn", "a unicorn")
    with pytest.raises(ValueError, match="dragon.*unicorn|unicorn.*dragon"):
        m.mentions(["a dog"], ["dog", "unicorn", "dragon"])


def test_user_table_from_dict_and_json(tmp_path):
    table = {"hurdle": ["fence", "jump"], "horse": ["pony"], "rider": []}
    m = ClassMatcher(table)
    assert m.class_names == ("hurdle", "horse", "rider")
    assert m.match("hurdle", "a wooden fence")
    assert m.match("horse", "two ponies")
    assert m.match("rider", "the riders")
    with pytest.raises(ValueError, match="person"):
        m.match("person", "a man")  # COCO classes are unknown to a custom table
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    from_file = ClassMatcher(path)
    assert from_file.table == m.table
    assert ClassMatcher(str(path)).match("hurdle", "jumps")


@pytest.mark.parametrize(
    "bad, message",
    [
        ({}, "empty"),
        ({"dog": "puppy"}, "list of strings"),
        ({"dog": ["puppy", 3]}, "invalid related words"),
        ({"": []}, "non-empty"),
        (["dog"], "mapping"),
    ],
)
def test_invalid_tables_raise(bad, message):
    with pytest.raises(ValueError, match=message):
        load_table(bad)


def test_invalid_table_files_raise(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        ClassMatcher(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        ClassMatcher(broken)
