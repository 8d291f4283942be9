"""The COCO-Counterfactuals mixtures take each pair's real row wherever its image is (the paper's
counts on a build whose real images sit in val and test), the real-only baseline `cf:real`, and
the leakage guard: a run training on images of an evaluation set is refused, and with
`--allow-eval-overlap` reported with those metrics marked (metrics.md, card, sweep summary)."""

from __future__ import annotations

import json
import math

import pytest
from datasets import Dataset

from training.config import DataConfig, SourceRef
from training.finetune_clip import main as train_main
from training.mixtures import ExampleSet, build_mixture

from helpers.training_helpers import COLORS, write_color_set, write_counterfactuals

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

#: The paper's (real fraction, counterfactual-row fraction) of N pairs (Le et al. 2023 §5; the
#: real-only baseline trains on the same real rows and no synthetic one).
PAPER = {"cf:real": (1, 0), "cf:base": (0.5, 0.25), "cf:medium": (1, 0.75), "cf:all": (1, 1)}


@pytest.fixture(scope="module")
def spread(tmp_path_factory):
    """A colour set (ids 1-8 train, 9-24 val, 25-40 test) and 13 pairs whose real images sit in
    all three splits; pair p's caption_0 names the colour of its image (id - 1 = p mod 8)."""
    root = tmp_path_factory.mktemp("spread")
    real = write_color_set(root / "real", {"train": 1, "val": 2, "test": 2})
    ids = [p + 1 + 8 * (p % 3) for p in range(13)]
    assert {i <= 8 for i in ids} == {True, False} and max(ids) > 24
    return real, write_counterfactuals(root / "cf", ids), ids


@pytest.mark.parametrize("mix", sorted(PAPER))
def test_cf_mixture_real_rows_come_from_any_split(spread, mix):
    real, cf, ids = spread
    n = len(ids)
    # --real-train-splits names the training splits of the other mixes: not these rows.
    m = build_mixture(
        DataConfig(
            real=SourceRef(str(real)),
            counterfactuals=SourceRef(str(cf)),
            mix=mix,
            data_seed=3,
            real_train_splits=("train",),
        )
    )
    frac_real, frac_cf = PAPER[mix]
    both = [m.train, m.validation, m.test]  # trained, selected on, scored by the ITM deltas
    assert sum(s.counts().get("real", 0) for s in both) == math.ceil(frac_real * n)
    rows = 2 * math.ceil(frac_cf * n) if mix != "cf:medium" else math.ceil(frac_cf * 2 * n)
    assert sum(s.counts().get("counterfactual", 0) for s in both) == rows
    assert not m.skipped
    splits = set()
    for s in both:
        for i in range(len(s)):
            if s.origin[i] != "real":
                continue
            image_id = s.tables[s.table_of[i]][s.row[i]]["image_id"]
            assert image_id in ids and s.caption[i] == f"a {list(COLORS)[(image_id - 1) % 8]} cube"
            splits.add("train" if image_id <= 8 else "val" if image_id <= 24 else "test")
    if frac_real == 1:
        assert splits == {"train", "val", "test"}
    if mix == "cf:real":
        # No pair trained on; the pairs of the held-out real rows scored by the ITM deltas (not
        # those of the validation rows, which select the checkpoint) are the held-out ITM set.
        assert [t for t, _ in m.heldout_cf] and len(m.heldout_cf) == len(m.test)
        cf_table = m.train.tables[m.heldout_cf[0][0]]
        assert sorted(cf_table[p]["caption_0"] for _, p in m.heldout_cf) == sorted(m.test.caption)
        assert not set(m.test.caption) & set(m.validation.caption)


def _run(real, cf, tiny_models_dir, out, *extra) -> int:
    return train_main(
        [
            "--real",
            str(real),
            "--counterfactuals",
            str(cf),
            "--mix",
            "cf:real",
            "--models",
            "tiny",
            "--tiny-models-dir",
            str(tiny_models_dir),
            "--batch-size",
            "2",
            "--max-steps",
            "1",
            "--num-workers",
            "0",
            "--output",
            str(out),
            *extra,
        ]
    )


def test_training_on_test_images_is_refused_and_allowed_marked(tmp_path, tiny_models_dir, capsys):
    """8 pairs, one per test image: cf:real trains on the real rows of 8 - floor(0.2 x 8) = 7
    of them, so 7 of the 8 test images are trained on."""
    real = write_color_set(tmp_path / "real", {"train": 1, "test": 1})
    cf = write_counterfactuals(tmp_path / "cf", list(range(9, 17)))
    assert _run(real, cf, tiny_models_dir, tmp_path / "refused") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "7 of the 8 images of the real test split" in err[0]
    assert "--allow-eval-overlap" in err[0] and "--real-test-split ''" in err[0]
    assert not (tmp_path / "refused" / "run.json").exists()
    # The case: the Karpathy test split trained on with --mix none, also refused.
    assert (
        train_main(
            [
                "--real",
                str(real),
                "--real-train-splits",
                "train",
                "test",
                "--real-val-split",
                "",
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--output",
                str(tmp_path / "r2"),
            ]
        )
        == 2
    )
    assert "8 of the 8 images of the real test split" in capsys.readouterr().err

    out = tmp_path / "allowed"
    assert _run(real, cf, tiny_models_dir, out, "--allow-eval-overlap") == 0
    record = json.loads((out / "run.json").read_text())
    assert {k: (v["shared"], v["images"]) for k, v in record["eval_overlap"].items()} == {"real_test": (7, 8)}
    table = (out / "metrics.md").read_text()
    card = (out / "final" / "README.md").read_text()
    for name in record["final_metrics"]:
        on_test = name.startswith(("zeroshot_retrieval", "itm/IR_r", "itm/TR_r"))
        for text in (table, card):
            shown = name.replace("_", r"\_")  # metric names are plain text in Markdown
            assert (f"| {shown} \\[overlaps training: 7/8 images\\] |" in text) == on_test, name
            assert (f"| {shown} |" in text) == (not on_test), name
            # A marked metric keeps its interval, or the reason it has none, as any other does.
            row = next(line for line in text.splitlines() if line.startswith(f"| {shown} "))
            if name in record["final_intervals"] or name in (record.get("final_interval_notes") or {}):
                assert row.count("[") > on_test or "(no interval" in row, row
    assert any(n.startswith("zeroshot_retrieval/") for n in record["final_metrics"])


def test_overlap_counts_odmap_queries_and_held_out_pairs():
    """The ODmAP queries count by COCO id (a D' row is an edit of its COCO image); counterfactual
    rows by their pair."""
    from training.eval_data import EvalData
    from training.leakage import check_eval_overlap
    from training.sources import DataInputError

    real = Dataset.from_dict({"image_id": [1, 2, 3]})
    cf = Dataset.from_dict({"caption_0": ["a", "b", "c"]})
    train = ExampleSet(tables=[real, cf])
    for row in range(3):
        train.add(0, row, "image", "", None, -1, "real")
    train.add(1, 0, "image_0", "", None, 0, "counterfactual")
    train.add(1, 0, "image_1", "", None, 0, "counterfactual")
    queries = ExampleSet(tables=[Dataset.from_dict({"image_id": [3, 4, 5, 6]})])
    for row in range(4):
        queries.add(0, row, "image", "", None, -1, "decorrelation")
    pairs = ExampleSet(tables=train.tables)
    for p in (0, 1):
        pairs.add(1, p, "image_0", "", None, -1, "counterfactual")
        pairs.add(1, p, "image_1", "", None, -1, "counterfactual")
    data = EvalData(queries=queries, cf_pairs=pairs)
    with pytest.raises(DataInputError, match="1 of the 4 images of the ODmAP queries"):
        check_eval_overlap(train, data, allow=False)
    got = check_eval_overlap(train, data, allow=True)
    assert {k: (v["shared"], v["images"]) for k, v in got.items()} == {
        "odmap_queries": (1, 4),
        "heldout_counterfactuals": (1, 2),
    }


def test_sweep_summary_marks_metrics_of_an_overlapping_set(tmp_path):
    from training.sweep import summarize

    overlap = {
        "real_test": {
            "set": "the real test split",
            "shared": 3,
            "images": 8,
            "metrics": ["zeroshot_retrieval/", "itm/IR_r"],
        }
    }
    for seed, r1 in ((1, 0.5), (2, 0.7)):
        (tmp_path / f"seed-{seed}").mkdir()
        (tmp_path / f"seed-{seed}" / "run.json").write_text(
            json.dumps(
                {
                    "eval_overlap": overlap if seed == 2 else {},
                    "final_metrics": {"zeroshot_retrieval/text_retrieval_recall@1": r1, "val_loss": 1.0},
                }
            )
        )
    summarize(tmp_path)
    table = (tmp_path / "summary.md").read_text()
    assert (
        r"| zeroshot\_retrieval/text\_retrieval\_recall@1 \[overlaps training: 3/8 images\] | 2 | 0.6000 ± 0.1414 |"
        in table
    )
    assert r"| val\_loss | 2 |" in table
