"""MITL candidate retrieval (`counterfactory eccv candidates`): ours vs a full-matrix torch baseline.

The paper's setting: 1,261 image and 1,333 caption queries (2,594) retrieve from the whole COCO
5K test gallery (5,000 images / 25,000 captions). Random unit embeddings (d = 512, CLIP ViT-B/32)
are written as an embedding-cache entry and read back memory-mapped, by the cache's own
`write_cache_entry` / `read_cache_entry` (builders/eccv_positives/mitl/embeddings.py); each model then
needs its top-25 (the candidates are the top-5, the golden-negative exclusion the top-25).

- ours: `builders.eccv_positives.mitl.candidates.model_topk` (streaming top-k over gallery chunks;
  the queries x gallery matrix never exists);
- baseline: `torch` queries @ gallery.T, then `torch.topk`, per modality.

Both must give the same ids, up to near-ties that float32 rounding orders differently. Then the
scaling part: the image queries over a 600,000-caption gallery (all COCO captions), ours only
unless `--baseline-at-scale` (its matrix alone is 3 GB). Peak RSS counts the memory-mapped
gallery pages read (1.2 GB at 600K x 512), not only allocations.

Run: `python benchmarks/eccv_candidates.py [--dim 512] [--scale-captions 600000] [--seed S]`.
Prints sizes, seconds and peak RSS above the start of each method; the last line is the speed ratio.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from odmap_benchmark import _current_rss_mb, _peak_rss_mb, _reset_peak_rss  # noqa: E402

from builders.eccv_positives.mitl.candidates import model_topk  # noqa: E402
from builders.eccv_positives.mitl.embeddings import read_cache_entry, write_cache_entry  # noqa: E402
from builders.eccv_positives.mitl.image_gallery import Gallery  # noqa: E402

K = 25


def _cached(
    entry: Path, n_images: int, n_captions: int, dim: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors stored as an embedding-cache entry and read back as `candidates` reads them."""

    def unit(n: int) -> np.ndarray:
        x = rng.standard_normal((n, dim), dtype=np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    write_cache_entry(entry, unit(n_images), unit(n_captions), {"model_id": "random"})
    return read_cache_entry(entry)


def _gallery(n_images: int, n_captions: int) -> Gallery:
    # Distinct texts, as random embeddings are: no caption is a copy of another.
    return Gallery(
        root=Path("."),
        image_ids=list(range(n_images)),
        image_files=[""] * n_images,
        caption_ids=list(range(n_captions)),
        caption_image_ids=[i % n_images for i in range(n_captions)],
        captions=[f"caption {i}" for i in range(n_captions)],
    )


def _baseline(images: np.ndarray, captions: np.ndarray, queries: dict[str, list[int]]) -> dict[str, np.ndarray]:
    img, cap = torch.from_numpy(np.array(images)), torch.from_numpy(np.array(captions))
    out = {}
    for modality, q, g in (("i2t", img[queries["i2t"]], cap), ("t2i", cap[queries["t2i"]], img)):
        if len(q):
            out[modality] = torch.topk(q @ g.T, K, dim=1).indices.numpy()
    return out


def _agreement(
    images: np.ndarray,
    captions: np.ndarray,
    queries: dict[str, list[int]],
    ours: dict[str, np.ndarray],
    base: dict[str, np.ndarray],
) -> tuple[int, float]:
    """Rows whose top-k ids differ, and the largest float64 score gap between the two lists at
    the same rank (float32 products rounded in another order swap near-ties, nothing more)."""
    rows, gap = 0, 0.0
    for modality, q_emb, g_emb in (("i2t", images, captions), ("t2i", captions, images)):
        if modality not in base:
            continue
        for r in np.flatnonzero((ours[modality] != base[modality]).any(axis=1)):
            rows += 1
            q = np.asarray(q_emb[queries[modality][r]], dtype=np.float64)
            a = np.asarray(g_emb[ours[modality][r]], dtype=np.float64) @ q
            b = np.asarray(g_emb[base[modality][r]], dtype=np.float64) @ q
            gap = max(gap, float(np.abs(a - b).max()))
    return rows, gap


def _measure(label: str, fn) -> tuple[float, dict[str, np.ndarray], str]:
    _reset_peak_rss()
    start_rss = _current_rss_mb()
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    line = f"  {label:<34s} {seconds:8.2f} s   peak RSS +{_peak_rss_mb() - start_rss:7.0f} MB"
    print(line, flush=True)
    return seconds, result, line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--captions", type=int, default=25000)
    parser.add_argument("--image-queries", type=int, default=1261)
    parser.add_argument("--caption-queries", type=int, default=1333)
    parser.add_argument("--scale-captions", type=int, default=600_000, help="0 skips the scaling part")
    parser.add_argument("--baseline-at-scale", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        images, captions = _cached(Path(tmp) / "gallery", args.images, args.captions, args.dim, rng)
        queries = {
            "i2t": sorted(rng.choice(args.images, args.image_queries, replace=False).tolist()),
            "t2i": sorted(rng.choice(args.captions, args.caption_queries, replace=False).tolist()),
        }
        print(
            f"{len(queries['i2t']) + len(queries['t2i'])} queries over {args.images} images / "
            f"{args.captions} captions, d={args.dim}, top-{K}, torch threads {torch.get_num_threads()}"
        )
        gallery = _gallery(args.images, args.captions)
        t_ours, ours, _ = _measure("ours (streaming top-k)", lambda: model_topk(images, captions, gallery, queries, K))
        t_base, base, _ = _measure("baseline (full matrix + topk)", lambda: _baseline(images, captions, queries))
        differing, gap = _agreement(images, captions, queries, ours, base)
        same = gap < 1e-6
        print(
            f"  top-{K} ids differ in {differing} of {len(queries['i2t']) + len(queries['t2i'])} "
            f"rows, largest score gap at a rank {gap:.1e} (near-ties only: {same})"
        )
        if args.scale_captions:
            _, big = _cached(Path(tmp) / "gallery_big", 1, args.scale_captions, args.dim, rng)
            scale_q = {"i2t": queries["i2t"], "t2i": []}
            print(f"scaling: {len(scale_q['i2t'])} image queries over {args.scale_captions} captions")
            big_gallery = _gallery(args.images, args.scale_captions)
            _measure("ours (streaming top-k)", lambda: model_topk(images, big, big_gallery, scale_q, K))
            if args.baseline_at_scale:
                _measure("baseline (full matrix + topk)", lambda: _baseline(images, big, scale_q))
    print(
        f"speed ratio baseline/ours at {args.captions} captions: {t_base / t_ours:.2f}x "
        f"(same rankings up to near-ties: {same})"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
