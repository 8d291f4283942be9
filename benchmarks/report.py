"""Wall time of `counterfactory benchmark` for N models against N x one model, and the cost of
adding one model to a report whose embeddings are cached (run by hand; not part of the tests).

Input: a generated COCO-format fixture (`counterfactory fixture coco --images N`) built as a
coco-captions test split and scored with the project's two tiny random-init CLIPs (transformers A,
open_clip B), each run a fresh `counterfactory benchmark` process, as a user runs it:

1. A alone, B alone, then A + B together, each with an empty cache. Target: T(A+B) / (T(A) +
   T(B)) <= 1.05: two models cost what two separate reports cost (a process's start-up and the
   dataset opening are paid once, so the ratio falls below 1 on small inputs).
2. A + B with the cache that report 1's A filled. Target: T(A+B, A cached) / T(B) <= 1.2: adding
   a model to a report encodes only that model.
3. The cost of the intervals (#35): A + B with `--bootstrap 1000` (the default: every metric's
   95 % interval, the paired tests between the two models) against `--bootstrap 0`, each from an
   empty cache. Target: T(B = 1000) / T(B = 0) <= 1.25 on a split of about 1,000 images.

Reports 1 and 2 run with `--bootstrap 0` (they time the encoding and the cache), report 3 with
the blind baseline off (`--blind-lm none`: it loads a language model, not the bootstrap's cost).

Times are the best of `--repeats` runs (the machine may be shared). Run:
`python benchmarks/report.py [--images 4000] [--repeats 2]`
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from builders.models.profiles import tiny_profile  # noqa: E402


def cli(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "builders.app.cli", *args],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def timed_report(models: list[str], coco: Path, cache: Path, out: Path, bootstrap: int = 0) -> float:
    start = time.perf_counter()
    cli(
        "benchmark",
        *(a for m in models for a in ("--model", m)),
        "--coco",
        str(coco),
        "--cache-dir",
        str(cache),
        "--output",
        str(out),
        "--bootstrap",
        str(bootstrap),
        "--blind-lm",
        "none",
    )
    return time.perf_counter() - start


def best_of(
    repeats: int, models: list[str], coco: Path, tmp: Path, seed_cache: Path | None = None, bootstrap: int = 0
) -> float:
    """Best wall time of a report of `models` starting from a copy of `seed_cache` (or empty)."""
    times = []
    for n in range(repeats):
        cache = tmp / f"cache-{len(models)}-{n}-{seed_cache is not None}-{bootstrap}"
        if seed_cache is not None:
            shutil.copytree(seed_cache, cache)
        times.append(timed_report(models, coco, cache, tmp / f"out-{cache.name}", bootstrap))
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--images", type=int, default=4000, help="fixture images (default 4000: a test split of 1,000)"
    )
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    profile = tiny_profile(None)
    a, b = str(profile.clip), str(profile.open_clip)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        cli("fixture", "coco", str(tmp / "coco"), "--images", str(args.images))
        cli(
            "build", "coco-captions", "--coco-root", str(tmp / "coco"), "--splits", "test", "--output", str(tmp / "cc")
        )
        from datasets import load_dataset

        n_test = len(load_dataset(str(tmp / "cc"), "default", split="test"))
        print(f"input: coco-captions test split of {n_test} images (~5 captions each), tiny CLIPs A, B")
        t_a = best_of(args.repeats, [a], tmp / "cc", tmp)
        t_b = best_of(args.repeats, [b], tmp / "cc", tmp)
        t_ab = best_of(args.repeats, [a, b], tmp / "cc", tmp)
        a_cache = tmp / "a-cache"
        timed_report([a], tmp / "cc", a_cache, tmp / "a-out")
        t_ab_cached = best_of(args.repeats, [a, b], tmp / "cc", tmp, seed_cache=a_cache)
        t_boot = best_of(args.repeats, [a, b], tmp / "cc", tmp, bootstrap=1000)
    print(
        f"T(A) {t_a:.1f} s, T(B) {t_b:.1f} s, T(A+B) {t_ab:.1f} s, T(A+B | A cached) {t_ab_cached:.1f} s, "
        f"T(A+B, B = 1000) {t_boot:.1f} s"
    )
    print(f"N models vs N x one: T(A+B) / (T(A) + T(B)) = {t_ab / (t_a + t_b):.2f} (target <= 1.05)")
    print(f"one more model: T(A+B | A cached) / T(B) = {t_ab_cached / t_b:.2f} (target <= 1.2)")
    print(f"intervals and paired tests: T(B = 1000) / T(B = 0) = {t_boot / t_ab:.2f} (target <= 1.25)")


if __name__ == "__main__":
    main()
