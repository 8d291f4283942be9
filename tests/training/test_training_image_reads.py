"""The training data path reads image bytes a batch at a time (#44): the DataLoader asks for a
whole batch and each (table, column) of it is one Arrow gather, never a `datasets` row read per
image (a query and a formatter each, benchmarks/trainer_startup.py times both). Counted through
`finetune_clip.py`, not timed; and the bytes, pixels, captions and negatives are those the
per-row reads gave, on several tables, a `select()`ed one and a worker process."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import datasets
import numpy as np
import torch
from PIL import Image

from training.backends import PixelPipeline
from training.config import SourceRef
from training.data import ExampleDataset, make_loader
from training.finetune_clip import main as train_main
from training.mixtures import CF_COLUMNS, REAL_COLUMNS, ExampleSet
from training.sources import open_table

from helpers.publish_helpers import one_error_line
from helpers.training_helpers import REAL_FEATURES, write_color_set, write_counterfactuals, write_split


def count_row_reads(monkeypatch) -> list:
    """Every `Dataset[int]` and `Column[int]` from now on, in this process."""
    reads: list = []
    for cls in (datasets.Dataset, datasets.arrow_dataset.Column):
        real = cls.__getitem__

        def counting(self, key, real=real):
            if isinstance(key, int | np.integer):
                reads.append(key)
            return real(self, key)

        monkeypatch.setattr(cls, "__getitem__", counting)
    return reads


def test_a_mixture_run_reads_no_dataset_row_one_at_a_time(tmp_path, tiny_models_dir, monkeypatch):
    real = write_color_set(tmp_path / "real", {"train": 2, "test": 1})
    cf = write_counterfactuals(tmp_path / "cf", list(range(1, 16)))
    reads = count_row_reads(monkeypatch)
    argv = ["--real", str(real), "--real-train-splits", "train", "--counterfactuals", str(cf)]
    argv += ["--mix", "cf:medium", "--hard-negatives", "negclip", "--models", "tiny"]
    argv += ["--tiny-models-dir", str(tiny_models_dir), "--batch-size", "4", "--max-steps", "2"]
    argv += ["--num-workers", "0", "--output", str(tmp_path / "run")]
    assert train_main(argv) == 0
    # Trained (2 steps of 4 images from two tables) and evaluated: every image came through a gather.
    assert (tmp_path / "run" / "final").is_dir()
    assert reads == []


def _examples(tmp_path: Path) -> ExampleSet:
    """Interleaved examples of three tables: a real split, a `select()`ed real split (datasets maps
    its rows through an indices table, as the zero-shot sets' are) and both image columns of a
    counterfactual split."""
    real = write_color_set(tmp_path / "real", {"train": 1, "test": 1})
    cf = write_counterfactuals(tmp_path / "cf", [1, 2, 3, 4, 5])
    train, _ = open_table(SourceRef(str(real)), "default", "train", REAL_COLUMNS)
    test, _ = open_table(SourceRef(str(real)), "default", "test", REAL_COLUMNS)
    pairs, _ = open_table(SourceRef(str(cf)), "default", "test", CF_COLUMNS)
    test = test.select([5, 0, 7, 2])
    out = ExampleSet(tables=[train, test, pairs])
    rng = np.random.default_rng(0)
    for k, row, column in (
        [(0, r, "image") for r in range(len(train))]
        + [(1, r, "image") for r in range(4)]
        + [(2, r, c) for r in range(5) for c in ("image_0", "image_1")]
    ):
        negative = f"not {k} {row}" if rng.random() < 0.5 else None
        out.add(k, row, column, f"{column} of table {k} row {row}", negative, -1, "real")
    return out.subset(rng.permutation(len(out)).tolist())


def test_image_bytes_and_batches_equal_the_per_row_reads(tmp_path):
    examples = _examples(tmp_path)
    keys = zip(examples.table_of, examples.row, examples.column, strict=True)
    old = [examples.tables[k][row][column]["bytes"] for k, row, column in keys]
    pixels = PixelPipeline(40, (0.0,) * 3, (1.0,) * 3)  # no resize; per batch: x / 255
    dataset = ExampleDataset(examples, pixels.per_image(), pixels.size)
    assert dataset.image_bytes(list(range(len(examples)))) == old
    assert [dataset.image_bytes([i]) for i in range(len(examples))] == [[b] for b in old]
    # Through a worker process, in the sampler's order, with the captions and negatives beside.
    backend = SimpleNamespace(pixels=pixels, tokenize=lambda texts: texts)
    batches = [[5, 1, 17], [0, 2], list(range(6, 17)), [3, 4, 18, 19, 20, 21]]
    loader = make_loader(examples, batches, backend, num_workers=1, negatives=True)
    for order, batch in zip(batches, loader, strict=True):
        want = np.stack([np.asarray(Image.open(io.BytesIO(old[i])).convert("RGB")) for i in order])
        got = (batch["pixel_values"] * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
        np.testing.assert_array_equal(got, want)
        assert batch["text"] == [examples.caption[i] for i in order]
        assert batch["negative_text"] == [examples.negative[i] or "" for i in order]
        assert batch["negative_mask"].tolist() == [examples.negative[i] is not None for i in order]


def test_an_undecodable_test_image_is_named_without_a_row_read(tmp_path, tiny_models_dir, monkeypatch, capsys):
    """After a batch fails to decode, the first bad image of it is named from the same Arrow
    gathers the loader uses: rows 13 and 14 of 16 do not decode, the fourth batch of 4 fails."""
    real = write_color_set(tmp_path / "real", {"train": 1, "test": 2})
    rows = datasets.Dataset.from_parquet(str(real / "data" / "test-00000-of-00001.parquet")).to_dict()
    for row in (13, 14):
        rows["image"][row] = {"bytes": b"not an image", "path": None}
    write_split(real, "test", rows, REAL_FEATURES)
    reads = count_row_reads(monkeypatch)
    argv = ["--real", str(real), "--eval-only", "--models", "tiny", "--tiny-models-dir", str(tiny_models_dir)]
    argv += ["--eval-batch-size", "4", "--num-workers", "0", "--report-to", "none", "--output", str(tmp_path / "run")]
    capsys.readouterr()
    assert train_main(argv) == 2
    line = one_error_line(capsys)
    assert "real row 13, column 'image': the image cannot be decoded (unreadable_image)" in line, line
    assert reads == []
