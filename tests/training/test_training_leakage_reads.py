"""The leakage guard reads its tables' columns whole, never a row at a time (#44): under datasets
5.x each `Dataset.__getitem__` deep-copies the table's replay list, so a check that read its
600K training rows one by one took hours before the first step. Counted on stand-in tables, not
timed (benchmarks/trainer_startup.py times it)."""

from __future__ import annotations

import numpy as np
from datasets import Dataset
from datasets.arrow_dataset import Column

from training.eval_data import EvalData
from training.leakage import check_eval_overlap
from training.mixtures import ExampleSet

from helpers.training_helpers import png


class RowCounting:
    """A table (or column) that counts every row read one at a time: `t[3]`, and each row an
    iteration yields. What it returns that is a table or a column counts the same way."""

    def __init__(self, inner, reads: list[int]) -> None:
        self._inner, self._reads = inner, reads

    def _wrap(self, value):
        return RowCounting(value, self._reads) if isinstance(value, Dataset | Column) else value

    def __getitem__(self, key):
        if isinstance(key, int | np.integer):
            self._reads[0] += 1
        return self._wrap(self._inner[key])

    def __iter__(self):
        for row in self._inner:
            self._reads[0] += 1
            yield row

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if callable(value):
            return lambda *args, **kwargs: self._wrap(value(*args, **kwargs))
        return self._wrap(value)


def _tables():
    """A real table (COCO ids 1-6 with their bytes) and a pairs table made from images 2 and 9."""
    cell = lambda data: {"bytes": data, "path": None}  # noqa: E731
    real = Dataset.from_dict(
        {"image": [cell(png((10 + 20 * i, 0, 0))) for i in range(6)], "image_id": [1, 2, 3, 4, 5, 6]}
    )
    cf = Dataset.from_dict(
        {
            "image_0": [cell(png((0, 10 + 20 * p, 0))) for p in range(2)],
            "image_1": [cell(png((0, 0, 10 + 20 * p))) for p in range(2)],
            "caption_0": ["a dog on a bench", "a red car"],
            "caption_1": ["a cat on a bench", "a blue car"],
            "source_image_id": ["2", "9"],
        }
    )
    return real, cf


def _check(real, cf) -> dict:
    train = ExampleSet(tables=[real, cf])
    for row in range(4):
        train.add(0, row, "image", f"caption {row}", None, -1, "real")
    train.add(1, 1, "image_0", "a red car", "a blue car", 1, "counterfactual")
    test = ExampleSet(tables=[real])
    for row in (3, 4, 5):
        test.add(0, row, "image", "", None, -1, "real")
    pairs = ExampleSet(tables=[real, cf])
    for p in (0, 1):
        pairs.add(1, p, "image_0", "", None, -1, "counterfactual")
        pairs.add(1, p, "image_1", "", None, -1, "counterfactual")
    data = EvalData(
        retrieval=test,
        captions=["caption 3", "x", "y"],
        caption_image=np.array([4, 5, 6]),
        cf_pairs=pairs,
    )
    return check_eval_overlap(train, data, allow=True, negatives=True)


def test_the_overlap_check_reads_no_row_one_at_a_time():
    real, cf = _tables()
    reads = [0]
    got = _check(RowCounting(real, reads), RowCounting(cf, reads))
    assert reads == [0]
    # The same answer as on the plain tables, and the one the fixture plants: test image 4 and
    # its caption are trained on; pair 1 is trained on (image and both captions).
    assert got == _check(real, cf)
    summary = {k: (v["shared"], v["images"], v["captions_shared"], v["captions"]) for k, v in got.items()}
    assert summary == {"real_test": (1, 3, 1, 3), "heldout_counterfactuals": (1, 2, 2, 4)}
