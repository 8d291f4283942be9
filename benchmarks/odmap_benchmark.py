"""ODmAP@k at COCO scale: 10,000 queries over a 600,000-caption gallery in bounded memory.

Random embeddings stand in for a model's image / caption embeddings and a random gallery x class
mention matrix for the precomputed noun-phrase mentions (`gallery_mentions`). The run streams the
gallery in chunks (`topk_from_embeddings`), so the 10,000 x 600,000 score matrix (24 GB as float32)
never exists; the reported peak RSS is the process's high-water mark during the benchmark (reset
first through /proc/self/clear_refs where Linux allows it).

Run: `python benchmarks/odmap_benchmark.py [--queries N] [--gallery N] [--dim D]`.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import numpy as np
import torch

from counterfactory_metrics.odmap.odmap_scores import odmap_from_topk
from counterfactory_metrics.map_at_r.topk import topk_from_embeddings

__all__ = ["run_odmap_benchmark"]


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def _peak_rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _current_rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _random_inputs(
    rng: np.random.Generator, num_queries: int, gallery_size: int, dim: int, num_classes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    query = rng.standard_normal((num_queries, dim), dtype=np.float32)
    gallery = rng.standard_normal((gallery_size, dim), dtype=np.float32)
    # Zipf-like class frequencies (a few classes such as "person" are mentioned very often)
    freq = np.minimum(0.5, 0.6 / np.arange(1, num_classes + 1) ** 0.9).astype(np.float32)
    mentions = np.empty((gallery_size, num_classes), dtype=bool)
    for g0 in range(0, gallery_size, 65_536):  # chunked so no G x C float matrix is built
        block = rng.random((min(65_536, gallery_size - g0), num_classes), dtype=np.float32)
        mentions[g0 : g0 + len(block)] = block < freq
    removed = np.zeros((num_queries, num_classes), dtype=bool)
    present = np.zeros((num_queries, num_classes), dtype=bool)
    for q in range(num_queries):
        classes = rng.choice(num_classes, size=int(rng.integers(2, 6)), replace=False, p=freq / freq.sum())
        n_removed = int(rng.integers(1, len(classes)))
        removed[q, classes[:n_removed]] = True
        present[q, classes[n_removed:]] = True
    return query, gallery, mentions, removed, present


def run_odmap_benchmark(
    num_queries: int = 10_000,
    gallery_size: int = 600_000,
    dim: int = 64,
    num_classes: int = 80,
    k: int = 10,
    chunk_size: int = 32_768,
    query_chunk_size: int = 1_024,
    seed: int = 0,
) -> list[str]:
    """Run the benchmark and return the lines to print (sizes, times, peak memory)."""
    rng = np.random.default_rng(seed)
    baseline_mb = _current_rss_mb()
    query, gallery, mentions, removed, present = _random_inputs(rng, num_queries, gallery_size, dim, num_classes)
    inputs_mb = (query.nbytes + gallery.nbytes + mentions.nbytes + removed.nbytes + present.nbytes) / 2**20
    full_matrix_gb = num_queries * gallery_size * 4 / 1e9
    reset = _reset_peak_rss()
    start_rss = _current_rss_mb()

    t0 = time.perf_counter()
    topk, _ = topk_from_embeddings(query, gallery, k, chunk_size=chunk_size, query_chunk_size=query_chunk_size)
    t1 = time.perf_counter()
    result = odmap_from_topk(topk, mentions, removed, present, k_values=(1, 5, k))
    t2 = time.perf_counter()
    peak = _peak_rss_mb()
    chunk_mb = query_chunk_size * chunk_size * 4 / 2**20
    scores = ", ".join(f"{name} {value:.4f}" for name, value in result.as_dict().items())
    return [
        f"ODmAP benchmark: {num_queries:,} queries x {gallery_size:,} gallery captions, "
        f"dim {dim}, {num_classes} classes, k={k} (random embeddings and mention matrix, "
        f"seed {seed}); torch threads {torch.get_num_threads()}",
        f"  inputs in memory: {inputs_mb:.0f} MB (embeddings + {gallery_size:,} x {num_classes} "
        f"bool mentions); a full similarity matrix would be {full_matrix_gb:.1f} GB",
        f"  streaming top-{k}: {t1 - t0:.1f} s ({num_queries * gallery_size / (t1 - t0) / 1e6:.0f}M "
        f"scores/s; blocks of {query_chunk_size:,} queries x {chunk_size:,} captions = "
        f"{chunk_mb:.0f} MB)",
        f"  ODmAP@{{1,5,{k}}} from top-{k} + mentions: {t2 - t1:.2f} s -> {scores}",
        f"  peak RSS {peak:.0f} MB during the run ("
        + (
            f"reset at {start_rss:.0f} MB after building inputs"
            if reset
            else "process high-water mark, includes earlier work"
        )
        + f"; {baseline_mb:.0f} MB before inputs)",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--gallery", type=int, default=600_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for line in run_odmap_benchmark(args.queries, args.gallery, args.dim, seed=args.seed):
        print(line)


if __name__ == "__main__":
    main()
