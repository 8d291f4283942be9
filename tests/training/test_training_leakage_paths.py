"""The leakage guard beyond COCO image ids (#34): captions (normalised text, tied to the COCO
image they were written for), image bytes (sha256 of what is stored), and the data that selects
the checkpoint (the validation loss of --best-by-val-loss). Each path is refused in one line,
or run with --allow-eval-overlap and its metrics marked; and the `cf:` mixtures keep a held-out
pair's captions and its real image out of training and checkpoint selection by construction."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset

from training.config import DataConfig, SourceRef
from training.eval_data import EvalData
from training.finetune_clip import main as train_main
from training.leakage import check_eval_overlap
from training.mixtures import ExampleSet, build_mixture
from training.sources import DataInputError

from helpers.training_helpers import (
    CF_FEATURES,
    COLORS,
    REAL_FEATURES,
    TEMPLATES,
    png,
    write_color_set,
    write_counterfactuals,
    write_split,
)

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("counterfactory: error: ")]


def tiny(tiny_models_dir, out, *extra: str) -> list[str]:
    return [
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--num-workers",
        "0",
        "--batch-size",
        "4",
        "--max-steps",
        "1",
        "--report-to",
        "none",
        "--output",
        str(out),
        *extra,
    ]


def test_captions_are_compared_casefolded_with_whitespace_and_trailing_punctuation_dropped():
    from training.leakage import normalise

    assert normalise("  A Dog\ton  a Bench.. ") == normalise("a dog on a bench!") == "a dog on a bench"
    assert normalise("a dog, on a bench") != normalise("a dog on a bench")


def test_pairs_made_from_test_captions_without_a_source_image_are_refused(tmp_path, tiny_models_dir, capsys):
    """The issue's case: caption pairs whose captions are the COCO test split's, without a
    `source_image_id` (so the cf:all mixture has no real row to tie them to an image), trained on
    while R@K is reported on that split."""
    real = write_color_set(tmp_path / "real", {"train": 1, "test": 1})
    names = list(COLORS)
    cols = {k: [] for k in CF_FEATURES}
    for p, name in enumerate(names):  # test image p + 9 has the captions TEMPLATES x its colour
        cols["id"].append(f"pair-{p}")
        cols["image_0"].append({"bytes": png(COLORS[name], noise=20, seed=500 + 2 * p), "path": None})
        cols["image_1"].append({"bytes": png(COLORS[name], noise=20, seed=501 + 2 * p), "path": None})
        cols["caption_0"].append(TEMPLATES[0].format(name).upper() + ".")  # still the same caption
        cols["caption_1"].append(TEMPLATES[1].format(name))
        cols["source_image_id"].append("")
    write_split(tmp_path / "cf", "test", cols, CF_FEATURES)
    args = ["--real", str(real), "--counterfactuals", str(tmp_path / "cf"), "--mix", "cf:all"]
    assert train_main([*args, *tiny(tiny_models_dir, tmp_path / "refused")]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    # 8 pairs: 7 trained (the 8th held out for the ITM deltas), two test captions each.
    assert "14 of the 40 captions of the real test split (--real-test-split) are in the training data" in line, line
    assert "--real-test-split ''" in line and "--allow-eval-overlap" in line
    assert not (tmp_path / "refused" / "run.json").exists()

    out = tmp_path / "allowed"
    assert train_main([*args, *tiny(tiny_models_dir, out, "--allow-eval-overlap")]) == 0
    record = json.loads((out / "run.json").read_text())
    o = record["eval_overlap"]["real_test"]
    assert (o["shared"], o["captions_shared"], o["captions"], o["data"]) == (0, 14, 40, ["training"])
    assert (
        r"| zeroshot\_retrieval/text\_retrieval\_recall@1 \[overlaps training: 14/40 captions\] |"
        in (out / "metrics.md").read_text()
    )


def test_a_byte_identical_image_under_another_id_is_refused(tmp_path, tiny_models_dir, capsys):
    """Test image 9 is train image 1's file under another COCO id."""
    train_bytes = {}
    for split, ids in (("train", range(1, 9)), ("test", range(9, 17))):
        cols = {k: [] for k in REAL_FEATURES}
        for image_id in ids:
            name = list(COLORS)[(image_id - 1) % 8]
            data = train_bytes[1] if image_id == 9 else png(COLORS[name], noise=20, seed=image_id)
            train_bytes.setdefault(image_id, data)
            cols["image"].append({"bytes": data, "path": None})
            cols["image_id"].append(image_id)
            cols["caption_ids"].append([10 * image_id])
            cols["captions"].append([f"picture number {image_id}"])
        write_split(tmp_path / "real", split, cols, REAL_FEATURES)
    args = ["--real", str(tmp_path / "real"), "--real-train-splits", "train", "--real-val-split", ""]
    assert train_main([*args, *tiny(tiny_models_dir, tmp_path / "refused")]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "1 of the 8 images of the real test split (--real-test-split) are in the training data" in line, line


def test_selecting_the_checkpoint_on_the_test_split_is_refused(tmp_path, tiny_models_dir, capsys):
    """`--real-val-split test --best-by-val-loss`: the final model would be picked on the test set."""
    real = write_color_set(tmp_path / "real", {"train": 1, "test": 1})
    args = ["--real", str(real), "--real-train-splits", "train", "--real-val-split", "test"]
    assert train_main([*args, *tiny(tiny_models_dir, tmp_path / "refused", "--best-by-val-loss")]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert (
        "8 of the 8 images of the real test split (--real-test-split), and 40 of its 40 "
        "captions, are in the checkpoint-selection data (the validation examples of "
        "--best-by-val-loss)" in line
    ), line
    assert "--real-val-split" in line and "--allow-eval-overlap" in line
    assert not (tmp_path / "refused" / "run.json").exists()
    # Without --best-by-val-loss the validation loss selects nothing: no overlap to report.
    out = tmp_path / "reported"
    assert train_main([*args, *tiny(tiny_models_dir, out)]) == 0
    assert json.loads((out / "run.json").read_text())["eval_overlap"] == {}
    out = tmp_path / "allowed"
    assert train_main([*args, *tiny(tiny_models_dir, out, "--best-by-val-loss", "--allow-eval-overlap")]) == 0
    table = (out / "metrics.md").read_text()
    assert (
        r"| zeroshot\_retrieval/image\_retrieval\_recall@1 \[overlaps checkpoint selection: 8/8 images, 40/40 captions\] |"
        in table
    )


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """25 pairs, one per real image (ids 1-25 in the train split)."""
    root = tmp_path_factory.mktemp("pairs")
    real = write_color_set(root / "real", {"train": 4})
    return real, write_counterfactuals(root / "cf", list(range(1, 26)))


@pytest.mark.parametrize("mix", ["cf:real", "cf:base", "cf:medium", "cf:all"])
def test_a_held_out_pair_is_neither_trained_nor_selected_on(pairs, mix):
    """In cf:all a held-out pair's caption_0 was trained with its real image (and its caption_1
    as that row's NegCLIP negative), and le2023's validation loss picked the checkpoint on the
    same pairs that give IR_c / TR_c. Now a pair's real row goes where its pair goes, and the
    held-out 20 % is halved: validation, and the pairs scored by the ITM deltas."""
    real, cf = pairs
    scored_any = False
    for seed in range(4):
        m = build_mixture(
            DataConfig(real=SourceRef(str(real)), counterfactuals=SourceRef(str(cf)), mix=mix, data_seed=seed)
        )
        assert len(m.validation)
        scored = {p for _, p in m.heldout_cf}
        scored_any |= bool(scored)
        for name, s in (("train", m.train), ("validation", m.validation)):
            for i in range(len(s)):
                # A pair's rows are (cf table, pair); its real row is image id pair + 1.
                p = s.row[i] if s.column[i] != "image" else s.tables[s.table_of[i]][s.row[i]]["image_id"] - 1
                assert p not in scored, (name, seed, p, s.column[i])
    assert scored_any


def _guard_data():
    """A held-out pair made from COCO image 5 ('a dog on a bench.' / 'a cat on a bench') and a
    training real row of that image; tables without image bytes (ids and captions only)."""
    real = Dataset.from_dict({"image_id": [5, 6]})
    cf = Dataset.from_dict(
        {"caption_0": ["a dog on a bench."], "caption_1": ["a cat on a bench"], "source_image_id": ["5"]}
    )
    pairs = ExampleSet(tables=[real, cf])
    pairs.add(1, 0, "image_0", "", None, -1, "counterfactual")
    pairs.add(1, 0, "image_1", "", None, -1, "counterfactual")
    return real, cf, EvalData(cf_pairs=pairs)


def test_a_held_out_pairs_captions_trained_with_its_real_image_are_refused():
    real, cf, data = _guard_data()
    train = ExampleSet(tables=[real, cf])
    train.add(0, 0, "image", "A dog on  a Bench", "a cat on a bench!", -1, "real")
    # The same sentence written for another COCO image is COCO's own repetition, not a leak.
    train.add(0, 1, "image", "a cat on a bench", None, -1, "real")
    with pytest.raises(
        DataInputError, match="1 of the 2 captions of the held-out counterfactual pairs are in the training data"
    ):
        check_eval_overlap(train, data, allow=False)
    # With NegCLIP the negative caption is trained against too.
    got = check_eval_overlap(train, data, allow=True, negatives=True)
    assert {k: (v["shared"], v["captions_shared"], v["captions"]) for k, v in got.items()} == {
        "heldout_counterfactuals": (0, 2, 2)
    }


def test_held_out_pairs_in_the_selection_data_are_refused():
    real, cf, data = _guard_data()
    train = ExampleSet(tables=[real, cf])
    train.add(0, 1, "image", "a bird", None, -1, "real")
    selection = ExampleSet(tables=[real, cf])
    selection.add(1, 0, "image_0", "a dog on a bench.", "a cat on a bench", 0, "counterfactual")
    assert check_eval_overlap(train, data, allow=False) == {}
    with pytest.raises(DataInputError, match="checkpoint-selection data .* --best-by-val-loss"):
        check_eval_overlap(train, data, allow=False, selection=selection)
    got = check_eval_overlap(train, data, allow=True, selection=selection)["heldout_counterfactuals"]
    assert (got["shared"], got["images"], got["captions_shared"], got["data"]) == (1, 1, 1, ["checkpoint selection"])


def test_an_evaluation_image_stored_under_another_identity_is_matched_by_its_bytes():
    """A held-out pair whose image_1 is the bytes of a trained real image (another table, no
    shared id): one of the two pairs overlaps."""
    shared = png((10, 20, 30), noise=5, seed=1)
    cell = lambda data: {"bytes": data, "path": None}  # noqa: E731
    real = Dataset.from_dict({"image": [cell(shared)], "image_id": [7]})
    cf = Dataset.from_dict(
        {
            "image_0": [cell(png((0, 0, 9), seed=p)) for p in (1, 2)],
            "image_1": [cell(png((9, 0, 0))), cell(shared)],
            "caption_0": ["x0", "y0"],
            "caption_1": ["x1", "y1"],
        }
    )
    train = ExampleSet(tables=[real, cf])
    train.add(0, 0, "image", "a photo", None, -1, "real")
    pairs = ExampleSet(tables=[real, cf])
    for p in range(2):
        pairs.add(1, p, "image_0", "", None, -1, "counterfactual")
        pairs.add(1, p, "image_1", "", None, -1, "counterfactual")
    got = check_eval_overlap(train, EvalData(cf_pairs=pairs), allow=True)
    assert {k: (v["shared"], v["images"]) for k, v in got.items()} == {"heldout_counterfactuals": (1, 2)}
