"""The trainer's start-up: its eval-overlap check (training/leakage.py) on a large table, and the
training DataLoader's image reads on it (run by hand; not part of the test suite).
benchmarks/training.py measures a run's steady state (decoding included).

A parquet-backed real table of N rows (default 600,000, a real training table's size) opened as
the trainer opens one (`load_dataset`, image column cast to undecoded bytes), its rows the
training examples, and a 5,000-image test split of another table as the evaluation set. Prints
rows, the check's wall time and its rate per row, against two baselines: the check as it read
`ids[row]` one row at a time before issue #44, measured here on a sample of rows, and the rate the
issue measured on the fixture (~1.3 ms a row under datasets 5.x, 48,000 reads in 62.8 s).
Each image cell holds a few bytes (hashing is linear in the bytes stored, as any read is).

The image reads: the bytes of `--sample` rows in a shuffled order, as the DataLoader asks for them
(batches of 32), read the way `training.data.ExampleDataset` reads them (one Arrow gather per
batch) against the way it read them before (`table.select_columns([column])[row]`, a
`Dataset.__getitem__` per image); both give the same bytes (checked), the ratio is printed.

Run: `python benchmarks/trainer_startup.py [--rows 600000] [--sample 2000]`
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from training.data import ExampleDataset  # noqa: E402
from training.eval_data import EvalData  # noqa: E402
from training.leakage import check_eval_overlap  # noqa: E402
from training.mixtures import ExampleSet  # noqa: E402

#: The issue's measured per-row rate of the old check (62.8 s / 48,000 reads).
ISSUE_SECONDS_PER_ROW = 62.8 / 48_000


def table(n: int, root: Path, first_id: int):
    """n rows of (image bytes, COCO image id) opened as `training.sources.open_table` does."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Features, Image, Value, load_dataset

    ids = np.arange(first_id, first_id + n)
    image = pa.array([{"bytes": b"img%d" % i, "path": None} for i in ids.tolist()])
    features = Features({"image": Image(), "image_id": Value("int64")})
    data = pa.table({"image": image, "image_id": pa.array(ids)})
    data = data.replace_schema_metadata(features.arrow_schema.metadata)
    path = root / f"{first_id}.parquet"
    pq.write_table(data, path)
    ds = load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(root / "cache"))
    return ds.cast_column("image", Image(decode=False))


def examples(ds) -> ExampleSet:
    out = ExampleSet(tables=[ds])
    for row in range(len(ds)):
        out.add(0, row, "image", "a photo", None, -1, "real")
    return out


def per_row_reads(ds, sample: int) -> float:
    """Seconds a row of the pre-#44 read (`ids = ds["image_id"]; ids[row]`)."""
    ids = ds["image_id"]
    start = time.perf_counter()
    for row in range(sample):
        int(ids[row])
    return (time.perf_counter() - start) / sample


def image_reads(train: ExampleSet, sample: int, batch: int = 32) -> tuple[float, float]:
    """Seconds an image of the loader's byte reads before #44 (a row read each) and now."""
    order = np.random.default_rng(0).permutation(len(train))[:sample].tolist()
    batches = [order[b : b + batch] for b in range(0, len(order), batch)]
    column = train.tables[0].select_columns(["image"])
    start = time.perf_counter()
    old = [column[train.row[i]]["image"]["bytes"] for i in order]
    old_s = time.perf_counter() - start
    dataset = ExampleDataset(train, transform=None, min_side=0)
    start = time.perf_counter()
    new = [data for b in batches for data in dataset.image_bytes(b)]
    new_s = time.perf_counter() - start
    assert new == old, "the gathered bytes differ from the row reads'"
    return old_s / sample, new_s / sample


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=600_000)
    p.add_argument("--test-images", type=int, default=5_000)
    p.add_argument("--sample", type=int, default=2_000, help="rows read one at a time for the old rate")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        train = examples(table(args.rows, Path(tmp), 1))
        test = table(args.test_images, Path(tmp), 10**9)
        data = EvalData(
            retrieval=examples(test),
            captions=["a photo"] * len(test),
            caption_image=np.arange(10**9, 10**9 + len(test)),
        )
        start = time.perf_counter()
        overlap = check_eval_overlap(train, data, allow=False)
        seconds = time.perf_counter() - start
        old = per_row_reads(train.tables[0], args.sample)
        image_old, image_new = image_reads(train, min(args.sample * 10, args.rows))
    assert overlap == {}, overlap
    rows = args.rows + args.test_images
    print(f"input: {args.rows} training rows + {args.test_images} test images; load {os.getloadavg()[0]:.1f}")
    print(f"overlap check: {seconds:.2f} s = {seconds / rows * 1e6:.2f} us a row")
    print(
        f"old per-row read, measured on {args.sample} rows: {old * 1e3:.3f} ms a row -> "
        f"{old * rows:.1f} s for these rows, {old * rows / seconds:.0f}x the check's time"
    )
    print(
        f"old rate from issue #44 ({ISSUE_SECONDS_PER_ROW * 1e3:.2f} ms a row): "
        f"{ISSUE_SECONDS_PER_ROW * rows:.0f} s for these rows, {ISSUE_SECONDS_PER_ROW * rows / seconds:.0f}x"
    )
    print(
        f"loader image reads, {min(args.sample * 10, args.rows)} shuffled rows of {args.rows} in batches of 32: "
        f"{image_new * 1e6:.2f} us an image (one gather a batch) against {image_old * 1e6:.2f} us "
        f"(a row read each, before #44): {image_old / image_new:.1f}x"
    )


if __name__ == "__main__":
    main()
