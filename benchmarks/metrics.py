"""The ECCV Caption suite from a 5,000 x 25,000 similarity matrix: ours vs `eccv_caption` 0.1.0.

Random scores over the real COCO 5K test ids (rows: images, columns: captions, with a boost on
the original COCO pairs so the numbers are not all ~0) stand in for a model. Both sides start
from the same matrix and compute the same suite — ECCV mAP@R / R-Precision / R@1, COCO 5K
R@1/5/10, CxC R@1 — and every shared number is compared:

- ours: `eccv_suite_from_similarity` (exact stable top-k prefixes, vectorised metrics);
- eccv_caption: the matrix turned into top-50 rankings (`torch.topk`, the cheapest conversion;
  50 >= the largest ECCV R) as dicts of lists, then `Metrics.compute_all_metrics`.

COCO 1K is timed for ours only by default: eccv_caption 0.1.0 raises an IndexError on truncated
rankings whose fold-filtered list is empty, and filters full 25,000-item rankings in Python
(`--full-rankings` runs it that way: a full argsort plus several minutes). float64 scores are
the default so that no two scores tie (`torch.topk` orders ties arbitrarily, which would make
the two rankings differ); `--dtype float32` halves the memory.

It first runs the ODmAP@10 part of `odmap_benchmark.py` (10,000 queries x 600,000 captions,
peak memory; `--odmap-queries 0` skips it).

Run: `python benchmarks/metrics.py [--seed S] [--dtype float32] [--full-rankings]`.
The last line prints the end-to-end speed ratio.
"""

from __future__ import annotations

import argparse
import sys
import contextlib
import io
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from counterfactory_metrics.map_at_r.eccv_suite import EccvAnnotations, EccvSuiteConfig, eccv_suite_from_similarity

__all__ = ["run_retrieval_benchmark"]

#: eccv_caption 0.1.0 returns eccv_rprecision only next to eccv_map_at_r (its key typo): it is.
SUITE = ("eccv_map_at_r", "eccv_rprecision", "eccv_r1", "coco_5k_recalls", "cxc_r1")
COCO_1K = ("coco_1k_recalls",)
DEPTH = 50


def _scores(ann: EccvAnnotations, seed: int, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = np.asarray(list(ann.coco.i2t), dtype=np.int64)
    captions = ann.coco_test_ids
    sim = rng.standard_normal((len(images), len(captions)), dtype=np.dtype(dtype))
    column = {int(c): j for j, c in enumerate(captions)}
    rows = np.repeat(np.arange(len(images)), 5)
    cols = np.array([column[int(c)] for i in images for c in ann.coco.i2t[int(i)]])
    sim[rows, cols] += 2.5  # a weak "model": the true pairs score higher on average
    return sim, images, captions


def _reference(
    sim: np.ndarray, images: np.ndarray, captions: np.ndarray, targets: tuple[str, ...], depth: int | None
) -> tuple[dict, float, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "failed to import ujson"
        from eccv_caption import Metrics

    t0 = time.perf_counter()
    scores = torch.from_numpy(sim)
    if depth is None:  # full stable rankings
        i2t_idx = np.argsort(-sim, axis=1, kind="stable")
        t2i_idx = np.argsort(-sim.T, axis=1, kind="stable")
    else:
        i2t_idx = torch.topk(scores, depth, dim=1).indices.numpy()
        t2i_idx = torch.topk(scores.T, depth, dim=1).indices.numpy()
    i2t = {int(i): captions[r].tolist() for i, r in zip(images, i2t_idx, strict=True)}
    t2i = {int(c): images[r].tolist() for c, r in zip(captions, t2i_idx, strict=True)}
    t1 = time.perf_counter()
    metrics = Metrics()
    metrics.set_i2t_retrieved_items(i2t)
    metrics.set_t2i_retrieved_items(t2i)
    # verbose=False does not reach eccv_metrics' progress bar (tqdm always shows): silence stderr.
    with contextlib.redirect_stderr(io.StringIO()):
        result = metrics.compute_all_metrics(target_metrics=targets, Ks=(1, 5, 10), verbose=False)
    return result, t1 - t0, time.perf_counter() - t1


def _best_of(n: int, fn: Callable[[], dict]) -> tuple[dict, float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return result, min(times)


@contextlib.contextmanager
def _without_torch():
    from counterfactory_metrics.map_at_r import topk

    saved, topk._HAVE_TORCH = topk._HAVE_TORCH, False
    try:
        yield
    finally:
        topk._HAVE_TORCH = saved


def _compare(ours: dict, ref: dict) -> tuple[int, float]:
    diffs = [abs(ours[k][m] - float(ref[k][m])) for k in ref for m in ("i2t", "t2i")]
    return len(diffs), max(diffs)


def run_retrieval_benchmark(seed: int = 0, dtype: str = "float64", full_rankings: bool = False) -> list[str]:
    """Run the benchmark and return the lines to print (sizes, times, agreement, ratio)."""
    ann = EccvAnnotations.load()
    sim, images, captions = _scores(ann, seed, dtype)
    lines = [
        f"Retrieval benchmark: {len(images):,} images x {len(captions):,} captions (COCO 5K test "
        f"ids), {dtype} random scores + true-pair boost (seed {seed}), "
        f"{sim.nbytes / 2**20:.0f} MB; torch threads {torch.get_num_threads()}",
        f"  suite: {', '.join(SUITE)} (Ks 1, 5, 10), both directions",
    ]
    ours, ours_s = _best_of(2, lambda: eccv_suite_from_similarity(sim, images, captions, EccvSuiteConfig(SUITE), ann))
    ours_1k, ours_1k_s = _best_of(
        2, lambda: eccv_suite_from_similarity(sim, images, captions, EccvSuiteConfig(COCO_1K), ann)
    )
    lines.append(
        f"  ours from the matrix: {ours_s:.2f} s (COCO 1K R@1/5/10 on top: {ours_1k_s:.2f} s more); best of 2 runs"
    )
    # The metric Space in an environment without torch selects top-k with numpy instead.
    with _without_torch():
        no_torch, no_torch_s = _best_of(
            1, lambda: eccv_suite_from_similarity(sim, images, captions, EccvSuiteConfig(SUITE), ann)
        )
    lines.append(
        f"  ours without torch (numpy top-k, as the Space in a torch-free env): "
        f"{no_torch_s:.2f} s, {'same numbers' if no_torch == ours else 'MISMATCH'}"
    )

    if full_rankings:  # R@1 only: each K is another pass of Python filtering over full lists
        ref, convert_s, metric_s = _reference(sim, images, captions, SUITE + ("coco_1k_r1",), None)
    else:  # best of 2 as for ours (the first run also pays page faults and cold caches)
        runs = [_reference(sim, images, captions, SUITE, DEPTH) for _ in range(2)]
        ref, convert_s, metric_s = min(runs, key=lambda run: run[1] + run[2])
    ranking_kind = "full stable argsort" if full_rankings else f"top-{DEPTH} torch.topk"
    lines.append(
        f"  eccv_caption 0.1.0: matrix -> {ranking_kind} rankings as dicts "
        f"{convert_s:.2f} s + compute_all_metrics {metric_s:.2f} s = "
        f"{convert_s + metric_s:.2f} s"
    )
    if not full_rankings:
        lines.append(
            "  (COCO 1K not run for eccv_caption: it crashes on truncated rankings; "
            "--full-rankings runs it on full ones, R@1 only)"
        )
    n, worst = _compare({**ours, **ours_1k}, ref)
    lines.append(
        f"  agreement: {n} shared numbers, max |ours - eccv_caption| = {worst:.1e}"
        + (" (equal to 1e-9)" if worst <= 1e-9 else " (MISMATCH)")
    )
    summary = ", ".join(f"{k} {v['i2t']:.4f}/{v['t2i']:.4f}" for k, v in ours.items())
    lines.append(f"  ours (i2t/t2i): {summary}")
    ours_total = ours_s + (ours_1k_s if full_rankings else 0.0)
    lines.append(
        f"speed ratio (eccv_caption / ours, end to end on the same suite): {(convert_s + metric_s) / ours_total:.1f}x"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument(
        "--full-rankings", action="store_true", help="give eccv_caption full rankings and include COCO 1K (slow)"
    )
    parser.add_argument(
        "--odmap-queries", type=int, default=10_000, help="ODmAP@10 part: queries (0 skips it; default 10,000)"
    )
    parser.add_argument(
        "--odmap-gallery", type=int, default=600_000, help="ODmAP@10 part: gallery captions (default 600,000)"
    )
    args = parser.parse_args()
    if args.odmap_queries:
        # First, so its peak-memory reading is not inflated by the ECCV part.
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from odmap_benchmark import run_odmap_benchmark

        for line in run_odmap_benchmark(args.odmap_queries, args.odmap_gallery, seed=args.seed):
            print(line)
    for line in run_retrieval_benchmark(args.seed, args.dtype, args.full_rankings):
        print(line)


if __name__ == "__main__":
    main()
