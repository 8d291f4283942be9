"""The trainer's start-up (#44), run by hand; not part of the test suite. benchmarks/training.py
measures a run's steady state (decoding included).

1. Against open_clip_train (`--part peers`, the default): the trainer under `accelerate launch`
   (one process, as the README runs it), under `accelerate-launch` (accelerate's console script of
   the launch command alone: the same flags, without the imports of the CLI's other commands), in
   one process (`python training/finetune_clip.py`, = `counterfactory train`), and open_clip_torch's
   own trainer in one process (`python -m open_clip_train.main`) and under its launcher (`torchrun
   --nproc_per_node 1 -m open_clip_train.main`, as its README starts it on GPUs), on the same tiny
   open_clip weights (the project's tiny open_clip model, `local-dir:`) and the same image-caption
   pairs: a generated COCO-format fixture (`counterfactory fixture coco --images N`, default 200)
   built as coco-captions, one pair per caption of its train + restval images, read by the trainer
   from the build and by open_clip_train from the same image bytes written to files and a CSV
   (filepath, title). All fp32 on the CPU, one thread, no DataLoader worker, no evaluation set, the
   same batch (a tenth of the pairs: 10 steps an epoch) and runs of 1 and 6 epochs (10 and 60
   steps), each saving a checkpoint every epoch (both trainers' default). A fresh process per run;
   the runs interleaved (the sides' order turning each repetition), medians of n. Prints each
   side's fixed part (the intercept of time over the two step counts; the range of the wall one
   over the n repetitions) and time a step, in wall seconds and in CPU seconds (user + system of
   the run's processes, which other load on a shared machine barely moves), the ratios of each
   trainer side to open_clip_train started alike (one process to one process, a launcher to
   torchrun), n, the input size and the load average. Target: the trainer's fixed part <=
   open_clip_train's. open_clip_train needs its `training` extra (webdataset, braceexpand), which
   the project does not install: `pip install webdataset braceexpand`.
2. The eval-overlap check (`--part overlap`): training/leakage.py on a large table. A
   parquet-backed real table of N rows (default 600,000, a real training table's size) opened as
   the trainer opens one (`load_dataset`, image column cast to undecoded bytes), its rows the
   training examples, and a 5,000-image test split of another table as the evaluation set.
   Prints rows, the check's wall time and its rate per row, against two baselines: the check as
   it read `ids[row]` one row at a time before issue #44, measured here on a sample of rows, and
   the rate the issue measured on the fixture (~1.3 ms a row under datasets 5.x, 48,000 reads in
   62.8 s). Each image cell holds a few bytes (hashing is linear in the bytes stored, as any read
   is).

3. The DataLoader's image reads (also `--part overlap`): the bytes of `--sample` x 10 rows in a
   shuffled order, as the DataLoader asks for them (batches of 32), read the way
   `training.data.ExampleDataset` reads them (one Arrow gather per batch) against the way it read
   them before (`table.select_columns([column])[row]`, a `Dataset.__getitem__` per image); both
   give the same bytes (checked), the ratio is printed.

Issue #44's figures (2 shared cores, before the overlap check read whole columns): the trainer's
fixed part 39.6 s against open_clip_train's 11.5 s, its time a step 0.77x open_clip_train's.

Measured with `--part peers` (200 fixture images -> 600 pairs, batch 60, n = 3), fixed part in
CPU seconds, the ratio to open_clip_train's started alike in brackets:

    run (load)            accelerate launch   accelerate-launch   one process     open_clip_train  under torchrun
    D (idle, 0.2 -> 1.0)  9.6 s (1.47)        6.9 s (1.05)        5.2 s (1.07)    4.9 s            6.5 s
    earlier, 2 cores shared with other jobs (no torchrun side; ratios to open_clip_train in one process):
    A (6.1 -> 6.4)        10.3 s (1.82)       -                   5.5 s (0.98)    5.7 s
    B (4.3 -> 2.6)         9.5 s (1.94)       -                   5.6 s (1.14)    4.9 s
    C (2.7 -> 2.6)         9.7 s (2.06)       7.5 s (1.59)        5.7 s (1.21)    4.7 s

Idle, the wall and CPU fixed parts agree (run D: one process 5.2 s wall against 4.9 s); under
load the wall ones swung (one process 1.01x-1.93x open_clip_train's), the CPU ones much less.
Started alike, the trainer is within 5-7 % of open_clip_train: both import torch, torchvision and
open_clip (which imports transformers); the trainer also imports datasets, to read builds and
Hub datasets (about 0.3-0.5 s beyond the pandas both import), the whole difference. The launchers
cost alike: torchrun adds 1.6 s to open_clip_train, `accelerate-launch` 1.7 s to the trainer.
`accelerate launch` adds 4.4 s: accelerate's umbrella CLI imports its `estimate-memory` command,
which imports timm and transformers when installed (open_clip installs both), 2.7 s before the
script starts. Time a step, in CPU seconds: 0.79x-0.96x open_clip_train's.

Run: `python benchmarks/trainer_startup.py [--part peers] [--images 200] [--repeats 3]` and
`python benchmarks/trainer_startup.py --part overlap [--rows 600000] [--sample 2000]`
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from report_startup import cli, intercept  # noqa: E402  (this folder: the script's own)
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


def overlap(args: argparse.Namespace) -> None:
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


#: Both sides' command lines: fp32, one process on the CPU, no evaluation set, the same lr.
#: One process, fp32, one CPU thread (open_clip_train's runs get OMP_NUM_THREADS=1 alike).
LAUNCH_FLAGS = ["--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
LAUNCH_FLAGS += ["--num_cpu_threads_per_process", "1"]
#: `accelerate launch` and `accelerate-launch` (accelerate's console scripts, here through this
#: interpreter: a script's own may name another venv's).
LAUNCHERS = {
    "accelerate launch": [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch"],
    "accelerate-launch": [sys.executable, "-m", "accelerate.commands.launch"],
}


def pairs_fixture(images: int, root: Path) -> tuple[Path, Path, int]:
    """A coco-captions build of a generated fixture, and its train + restval pairs (one per
    caption, as the trainer's `--mix none` takes them) as image files and a CSV for
    open_clip_train. Returns the build, the CSV and the number of pairs."""
    from datasets import Image, load_dataset

    cli("fixture", "coco", str(root / "coco"), "--images", str(images))
    build = root / "cc"
    cli(
        "build",
        "coco-captions",
        "--coco-root",
        str(root / "coco"),
        "--splits",
        "train",
        "restval",
        "--output",
        str(build),
    )
    (root / "images").mkdir()
    rows = []
    for split in ("train", "restval"):
        table = load_dataset(str(build), "default", split=split).cast_column("image", Image(decode=False))
        for image, image_id, captions in zip(table["image"], table["image_id"], table["captions"], strict=True):
            path = root / "images" / f"{image_id}.jpg"
            path.write_bytes(image["bytes"])
            rows += [(str(path), caption) for caption in captions]
    with open(root / "pairs.csv", "w", newline="") as f:
        csv.writer(f).writerows([("filepath", "title"), *rows])
    return build, root / "pairs.csv", len(rows)


def trainer_argv(build: Path, model: str, batch: int, epochs: int, workers: int, out: Path) -> list[str]:
    """The trainer in one process (`python training/finetune_clip.py`, = `counterfactory train`)."""
    return [sys.executable, str(REPO / "training" / "finetune_clip.py"), "--real", str(build)] + [
        *("--real-test-split", "", "--real-val-split", "", "--backend", "open_clip", "--model", model, "--lr", "1e-4"),
        *("--batch-size", str(batch), "--epochs", str(epochs), "--num-workers", str(workers)),
        *("--report-to", "none", "--output", str(out)),
    ]


def launched(launcher: str):
    """The same under an accelerate launcher (one process); `accelerate launch` as the README runs it."""
    return lambda *args: [*LAUNCHERS[launcher], *LAUNCH_FLAGS, *trainer_argv(*args)[1:]]


def open_clip_train_argv(pairs: Path, model: str, batch: int, epochs: int, workers: int, out: Path) -> list[str]:
    return [sys.executable, "-m", "open_clip_train.main", "--train-data", str(pairs), "--dataset-type", "csv"] + [
        *("--csv-separator", ",", "--csv-img-key", "filepath", "--csv-caption-key", "title"),
        *("--model", model, "--precision", "fp32", "--lr", "1e-4", "--warmup", "0", "--seed", "0"),
        *("--batch-size", str(batch), "--epochs", str(epochs), "--workers", str(workers)),
        *("--logs", str(out.parent), "--name", out.name),
    ]


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, the process and its children) of a run."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # accelerate's --num_cpu_threads_per_process 1
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime


def fixed_and_step(times: dict[int, float], steps: dict[int, int]) -> tuple[float, float]:
    """The intercept and slope of time over the steps of the two run lengths."""
    return intercept(sorted((steps[e], t) for e, t in times.items()))


def torchrun(pairs: Path, model: str, batch: int, epochs: int, workers: int, out: Path) -> list[str]:
    """open_clip_train under torchrun (one process), as its README launches it on GPUs. Its logs go
    to its default ./logs/ in the run's folder: torchrun's parser takes `--logs` for a prefix of
    its own `--logs-specs`."""
    argv = open_clip_train_argv(pairs, model, batch, epochs, workers, out)
    at = argv.index("--logs")
    out.parent.mkdir(parents=True, exist_ok=True)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1"]
    return ["env", "-C", str(out.parent), *torchrun, *argv[1:at], *argv[at + 2 :]]


#: The sides, each a command line of (data, model, batch, epochs, workers, out) and its data.
SIDES = {
    "accelerate launch": launched("accelerate launch"),
    "accelerate-launch": launched("accelerate-launch"),
    "one process": trainer_argv,
    "open_clip_train": open_clip_train_argv,
    "open_clip_train under torchrun": torchrun,
}
#: Each side of the trainer against open_clip_train started the same way: one process against one
#: process, a launcher against open_clip_train's own launcher.
PEER = {
    "accelerate launch": "open_clip_train under torchrun",
    "accelerate-launch": "open_clip_train under torchrun",
    "one process": "open_clip_train",
}


def interleaved(args: argparse.Namespace, tmp: Path, data: dict[str, Path], model: str, batch: int) -> dict:
    """{side: {epochs: [(wall, cpu) per repetition]}}, the sides' order turning each repetition."""
    runs: dict[str, dict[int, list]] = {side: {e: [] for e in args.epochs} for side in SIDES}
    order = list(SIDES)
    for rep in range(args.repeats):
        for epochs in args.epochs:
            for side in order[rep % len(order) :] + order[: rep % len(order)]:
                out = tmp / "runs" / f"{order.index(side)}-{epochs}-{rep}"
                runs[side][epochs].append(timed(SIDES[side](data[side], model, batch, epochs, args.num_workers, out)))
    return runs


def peers(args: argparse.Namespace) -> None:
    if importlib.util.find_spec("webdataset") is None or importlib.util.find_spec("braceexpand") is None:
        raise SystemExit("open_clip_train needs its training extra: pip install webdataset braceexpand")
    from builders.models.profiles import tiny_profile

    model = tiny_profile(args.tiny_models_dir).open_clip  # local-dir:PATH, which both sides take
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as t:
        build, pairs, n_pairs = pairs_fixture(args.images, Path(t))
        batch = n_pairs // args.steps_per_epoch  # both drop the last incomplete batch
        data = {side: pairs if side.startswith("open_clip_train") else build for side in SIDES}
        runs = interleaved(args, Path(t), data, model, batch)
    steps = {e: e * args.steps_per_epoch for e in args.epochs}
    print(
        f"input: {args.images} fixture images -> {n_pairs} train pairs; batch {batch}, {args.steps_per_epoch} "
        f"steps an epoch, {' and '.join(map(str, steps.values()))} steps; tiny open_clip, fp32, CPU, 1 thread, "
        f"{args.num_workers} worker(s); n = {args.repeats} interleaved runs a point, medians"
    )
    fixed = {}
    for side, by_epochs in runs.items():
        wall, cpu = ({e: statistics.median(r[k] for r in rs) for e, rs in by_epochs.items()} for k in (0, 1))
        fixed[side] = (*fixed_and_step(wall, steps), *fixed_and_step(cpu, steps))
        per_rep = [fixed_and_step({e: rs[r][0] for e, rs in by_epochs.items()}, steps)[0] for r in range(args.repeats)]
        print(
            f"{side}: wall "
            + ", ".join(f"{steps[e]} steps {t:.1f} s" for e, t in wall.items())
            + f"; fixed part {fixed[side][0]:.1f} s (repetitions {min(per_rep):.1f}..{max(per_rep):.1f} s), "
            f"{fixed[side][1] * 1e3:.0f} ms a step; in CPU seconds: fixed part {fixed[side][2]:.1f} s, "
            f"{fixed[side][3] * 1e3:.0f} ms a step"
        )
    for side, peer in PEER.items():
        ref = fixed[peer]
        print(
            f"trainer ({side}) / {peer}: fixed part {fixed[side][0] / ref[0]:.2f} (target <= 1), "
            f"in CPU seconds {fixed[side][2] / ref[2]:.2f}; time a step {fixed[side][1] / ref[1]:.2f}, "
            f"in CPU seconds {fixed[side][3] / ref[3]:.2f} (< 1: the trainer's steps are faster)"
        )
    print(f"load average (1 min) before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPU(s)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("peers", "overlap"), default="peers")
    p.add_argument("--images", type=int, default=200, help="peers: fixture images")
    p.add_argument("--epochs", type=int, nargs=2, default=(1, 6), help="peers: the two run lengths")
    p.add_argument("--steps-per-epoch", type=int, default=10, help="peers: sets the batch (pairs // this)")
    p.add_argument("--num-workers", type=int, default=0, help="peers: DataLoader workers of both sides")
    p.add_argument("--repeats", type=int, default=3, help="peers: runs a point per side")
    p.add_argument("--tiny-models-dir", type=Path, default=None)
    p.add_argument("--rows", type=int, default=600_000, help="overlap: training rows")
    p.add_argument("--test-images", type=int, default=5_000, help="overlap: evaluation images")
    p.add_argument("--sample", type=int, default=2_000, help="overlap: rows read one at a time for the old rate")
    args = p.parse_args()
    peers(args) if args.part == "peers" else overlap(args)


if __name__ == "__main__":
    main()
