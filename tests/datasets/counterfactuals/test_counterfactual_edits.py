"""A counterfactual caption differs from its original only in the swapped word (issue #10 §1).

A hand-written corpus of awkward captions goes through `counterfactory build coco-counterfactuals
--stage captions --dataset ...` with a permissive similarity window (so most captions produce a
pair); for every published pair, cutting `replaced_word` out of `caption_0` and
`replacement_word` out of `caption_1` at `replaced_position` leaves identical strings, and
similarity and perplexity are those of the published `caption_1`."""

from __future__ import annotations

import json
import re
import math

import datasets
import pytest
import torch
from datasets import load_dataset
from sentence_transformers import util

from builders.counterfactuals.captions import CaptionModels
from builders.app.cli import main as cli_main
from builders.models.profiles import resolve_profile

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

#: (feature, caption): every feature the issue lists, several captions each.
CORPUS = [
    ("comma", "A man, a woman and a dog walking on the beach."),
    ("comma", "Two cats, one black and one white, sleeping on a couch."),
    ("comma", "On a sunny day, a boy throws a frisbee in the park."),
    ("comma", "A plate with rice, beans, and a fork on a table."),
    ("comma", "A kitchen with a stove, a sink, and a window."),
    ("period", "A red frisbee flying through the air."),
    ("period", "Dogs jumping for a flying frisbee."),
    ("period", "A bus parked next to a building."),
    ("period", "A giraffe standing in the grass near a tree."),
    ("period", "Some people riding horses on a dirt road."),
    ("no_period", "a cat sitting on a laptop keyboard"),
    ("no_period", "a train traveling down the tracks near a station"),
    ("no_period", "two zebras grazing in a field"),
    ("apostrophe", "A man's hand holding a cell phone."),
    ("apostrophe", "The dogs' toys are scattered on the floor."),
    ("apostrophe", "A woman's purse sitting on a wooden bench."),
    ("apostrophe", "The children's bikes are parked by the fence."),
    ("apostrophe", "It's a cat lying on a bed."),
    ("apostrophe", "A baseball player's bat hitting the ball."),
    ("hyphen", "A black-and-white photo of a horse in a field."),
    ("hyphen", "A well-dressed man standing next to a car."),
    ("hyphen", "A two-story house with a red door."),
    ("hyphen", "A half-eaten pizza on a paper plate."),
    ("hyphen", "A man riding a skate-board down a ramp."),
    ("quotes", 'A sign that says "stop" on a street corner.'),
    ("quotes", 'A shop with a "sale" banner over the window.'),
    ("quotes", "A bus with 'express' written on the side."),
    ("quotes", 'A "vintage" car parked in front of a house.'),
    ("number", "2 dogs playing with a ball in the yard."),
    ("number", "A clock tower showing 3:45 above the city."),
    ("number", "A group of 10 people standing near a bus."),
    ("number", "A plane with the number 747 on its tail."),
    ("number", "A pizza cut into 8 slices on a table."),
    ("double_space", "A cat  sitting on a chair."),
    ("double_space", "A man riding  a horse on the beach."),
    ("double_space", "Two  dogs running in the snow."),
    ("double_space", "A bowl of fruit  on a kitchen table."),
    ("double_space", "A boat  in the water near a dock."),
    ("whitespace", "  A dog sleeping on a couch."),
    ("whitespace", "A woman holding an umbrella in the rain.  "),
    ("whitespace", " A bicycle leaning against a wall. "),
    ("whitespace", "\tA bird sitting on a branch.\n"),
    ("whitespace", "A horse eating grass in a field.\n"),
    ("unicode", "A café with tables on the sidewalk."),
    ("unicode", "A man eating a crêpe at a table."),
    ("unicode", "A dog lying next to a piñata."),
    ("unicode", "A woman holding a cup of coffee — on a bench."),
    ("unicode", "A cat sitting on a chair … next to a lamp."),
    ("two_sentences", "A dog on a couch. The dog is sleeping."),
    ("two_sentences", "A man rides a bike. He is wearing a helmet."),
    ("two_sentences", "A kitchen with a stove. There is a pot on it."),
    ("two_sentences", "Two cats on a bed. One of them is asleep."),
    ("mixed", "A man's  dog, sitting on a bench."),
    ("mixed", ' "A cat" on a table, next to 2 cups.  '),
    ("mixed", "A kid's red-and-blue kite flying in the sky."),
    ("mixed", "Three people (two men and a woman) near a car."),
    ("mixed", "A truck; a car; and a bus on the road."),
    ("mixed", "A dog!  Running on the beach?"),
    ("mixed", "A plate of food: rice, chicken and broccoli."),
    ("mixed", "A giraffe's neck reaching a tree's leaves."),
    ("mixed", "A man holding a surf-board at the beach at 6 pm."),
    ("mixed", "A woman 's umbrella on the sidewalk ."),
]


#: A plain word, inner hyphens and apostrophes allowed (`skate-board`, `o'clock`).
WORD = re.compile(r"\w+(?:[-'’]\w+)*")


def cut(text: str, start: int, word: str) -> str:
    return text[:start] + text[start + len(word) :]


@pytest.fixture(scope="module")
def edits_build(tmp_path_factory, tiny_models_dir, nltk_data_dir):
    root = tmp_path_factory.mktemp("edits")
    source = root / "source"
    source.mkdir()
    datasets.Dataset.from_dict(
        {"text": [c for _, c in CORPUS], "key": [f"{feature}-{k}" for k, (feature, _) in enumerate(CORPUS)]}
    ).to_parquet(str(source / "train.parquet"))
    out = root / "out"
    assert (
        cli_main(
            [
                "build",
                "coco-counterfactuals",
                "--stage",
                "captions",
                "--dataset",
                str(source),
                "--text-column",
                "text",
                "--id-column",
                "key",
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--sim-low",
                "-1.01",
                "--sim-high",
                "1.01",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    return out


def test_pairs_differ_only_in_the_swapped_word(edits_build):
    assert len(CORPUS) >= 60
    rows = load_dataset(str(edits_build), split="test")
    by_id = {r["id"]: r for r in rows}
    texts = dict((f"{feature}-{k}", c) for k, (feature, c) in enumerate(CORPUS))
    for row in rows:
        c0, c1, start = row["caption_0"], row["caption_1"], row["replaced_position"]
        old, new = row["replaced_word"], row["replacement_word"]
        assert c0 == texts[row["id"]], "caption_0 is the source string, unchanged"
        assert c0[start : start + len(old)] == old and c1[start : start + len(new)] == new, row["id"]
        assert cut(c0, start, old) == cut(c1, start, new), (c0, c1)
        assert old.lower() != new.lower() and new.strip() == new and " " not in new
        # Both are plain words: a period or comma taken along would vanish from caption_1.
        assert WORD.fullmatch(old) and WORD.fullmatch(new), (c0, c1)
        # The edit is a whole word: no letter or digit glued on either side.
        for text, word in ((c0, old), (c1, new)):
            before, after = text[start - 1 : start], text[start + len(word) : start + len(word) + 1]
            assert not before.isalnum() and not after.isalnum(), (text, word)
    produced = {row["id"].split("-")[0] for row in rows}
    features = {feature for feature, _ in CORPUS}
    assert produced == features, f"no pair for {features - produced}"
    assert len(rows) >= 0.75 * len(CORPUS), f"only {len(rows)} of {len(CORPUS)} captions produced a pair"
    manifest = json.loads((edits_build / "build_manifest.json").read_text())
    assert manifest["items"] == len(CORPUS)
    assert sum(manifest["skipped"].values()) + len(rows) == len(CORPUS)
    assert set(by_id) <= set(texts)


def test_scores_are_those_of_the_published_caption(edits_build, tiny_models_dir):
    rows = load_dataset(str(edits_build), split="test")
    profile = resolve_profile("tiny", tiny_models_dir)
    models = CaptionModels.load(profile.mlm, profile.lm, profile.sentence)
    for row in rows:
        ids = models.lm_tokenizer(row["caption_1"], return_tensors="pt").input_ids
        with torch.no_grad():
            ppl = math.exp(models.lm(ids, labels=ids).loss.item())
        assert row["perplexity"] == pytest.approx(ppl, rel=1e-4), row["caption_1"]
        a, b = models.sentence.encode([row["caption_0"], row["caption_1"]], convert_to_tensor=True)
        assert row["similarity"] == pytest.approx(util.cos_sim(a, b).item(), abs=1e-5)
