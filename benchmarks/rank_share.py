"""Peak RSS of one build process vs the number of processes: each keeps only its parts' items.

A builder's work items (here ≈ 8 KB of Python objects each, like a COCO image record with its
polygons) are read once per process, which keeps only its own parts (`sharding.shares`). Worker 0
of 1 and worker 0 of 4 (job-array mode, each a fresh process) build the same input; their peak
RSS is read from the part stats the build writes. A builder whose `work_items()` is a generator
holds ~1/4 of the items with 4 workers; one returning a list still reads the whole list once, so
its peak is unchanged (it is freed before the parts are built). Run: `python benchmarks/rank_share.py
[--items N]`; the last lines print the ratios (4 workers / 1 worker) above the process's baseline.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = """
import sys
import datasets
from builders.engine.sharding.base import BuildInfo, Emit, OutputSpec
from builders.engine.sharding.runner import BuildRunConfig, run_build

n_items, as_list, out, n_workers = int(sys.argv[1]), sys.argv[2] == "list", sys.argv[3], int(sys.argv[4])
IDS = datasets.Features({"id": datasets.Value("int64")})

class Heavy:
    def outputs(self):
        return [OutputSpec("default", "train", IDS)]

    def work_items(self):
        # ~8 KB per item: an image record's id plus 300 floats of polygon coordinates.
        items = ({"id": i, "polygon": [float(i + j) for j in range(300)]} for i in range(n_items))
        return list(items) if as_list else items

    def source_option(self):
        return f"--n-items {n_items}"

    def process(self, items):
        for item in items:
            yield Emit("default/train", {"id": item["id"]})

    def info(self):
        return BuildInfo(builder="heavy", card_template="", pretty_name="Heavy", config={})

run_build(Heavy(), BuildRunConfig(output_dir=out, part_size=256, worker_index=0,
                                  num_workers=n_workers))
"""


def worker_peak(n_items: int, kind: str, n_workers: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "build"
        subprocess.run(
            [sys.executable, "-c", WORKER, str(n_items), kind, str(out), str(n_workers)],
            cwd=ROOT,
            check=True,
            stderr=subprocess.DEVNULL,
        )
        stats = [json.loads(p.read_text()) for p in out.glob("**/part-*.json")]
        return max(s["peak_rss_bytes"] for s in stats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=40_000)
    args = parser.parse_args()
    base = worker_peak(256, "generator", 1)  # one part: the process's own size
    print(f"baseline (1 part): {base / 2**20:.0f} MiB")
    for kind in ("generator", "list"):
        peaks = {w: worker_peak(args.items, kind, w) for w in (1, 4)}
        for w, peak in peaks.items():
            print(f"{kind:9s} worker 0 of {w}: peak RSS {peak / 2**20:.0f} MiB")
        ratio = (peaks[4] - base) / max(1, peaks[1] - base)
        print(f"{kind:9s} 4 workers / 1 worker, above the baseline: {ratio:.2f} (ideal 0.25)")


if __name__ == "__main__":
    main()
