"""Each process holds only its own parts' work items, and the manifest reports each one's memory.

A builder whose `work_items()` is a generator of countable objects shows how many items are
alive at any moment: a job-array worker of 2 must never hold more than its half (plus the part
being read), while the shards stay those of a one-process build.
"""

from __future__ import annotations

import json
import resource
import weakref
from dataclasses import dataclass

import pytest

from builders.engine.sharding.layout import OutputLayout
from builders.engine.sharding.merge import peak_rss_summary
from builders.engine.sharding.runner import BuildRunConfig, run_build

from helpers import toy_builder
from helpers.build_helpers import shard_digests

N_ITEMS, PART_SIZE = 40, 4


@dataclass(eq=False)
class Item:
    id: int


class CountingBuilder(toy_builder.ToyBuilder):
    """The toy builder over `Item`s yielded one by one; records the most items alive at once
    while the inputs are read and while parts are built."""

    def __init__(self, as_list: bool = False) -> None:
        super().__init__(toy_builder.ToyConfig(n_items=N_ITEMS))
        self.as_list = as_list
        self.alive: weakref.WeakSet[Item] = weakref.WeakSet()
        self.most_alive = {"reading": 0, "building": 0}

    def work_items(self):
        # A list (what most readers return) is the whole input at once, freed after the read.
        return list(self._items()) if self.as_list else self._items()

    def _items(self):
        for i in range(self.config.n_items):
            item = Item(i)
            self.alive.add(item)
            self.most_alive["reading"] = max(self.most_alive["reading"], len(self.alive))
            yield item
            del item

    def process(self, items):
        self.most_alive["building"] = max(self.most_alive["building"], len(self.alive))
        return super().process([item.id for item in items])


def _run(out, as_list=False, **run):
    builder = CountingBuilder(as_list)
    cfg = BuildRunConfig(output_dir=out, part_size=PART_SIZE, max_error_fraction=0.2, **run)
    return builder, run_build(builder, cfg)


@pytest.mark.parametrize("as_list", [False, True], ids=["generator", "list"])
def test_each_array_worker_holds_only_its_parts_items(tmp_path, as_list):
    out = tmp_path / "array"
    half = N_ITEMS // 2  # 10 parts of 4: each worker owns 5
    for worker in (0, 1):
        builder, _ = _run(out, as_list, worker_index=worker, num_workers=2)
        assert builder.most_alive["building"] == half, builder.most_alive
        if not as_list:  # while reading: the parts kept so far plus the one being cut
            assert builder.most_alive["reading"] <= half + PART_SIZE, builder.most_alive
    merger, result = _run(out, as_list, merge_only=True)
    if not as_list:
        assert merger.most_alive["reading"] <= PART_SIZE  # the merge keeps no part
    assert result.manifest["items"] == N_ITEMS and result.manifest["run"]["parts"] == 10

    single_builder, single = _run(tmp_path / "single")
    assert single_builder.most_alive["building"] == N_ITEMS
    assert shard_digests(out) == shard_digests(tmp_path / "single")
    assert result.manifest["outputs"] == single.manifest["outputs"]


def test_manifest_reports_each_processs_peak_rss(tmp_path):
    out = tmp_path / "array"
    for worker in (0, 1):
        _run(out, worker_index=worker, num_workers=2)
    _, result = _run(out, merge_only=True)
    peak = result.manifest["peak_rss_bytes"]
    layout = OutputLayout(out)
    stats = [json.loads(layout.stats_file(k).read_text()) for k in range(10)]
    assert peak["per_part"] == [s["peak_rss_bytes"] for s in stats]
    for rank in (0, 1):
        assert peak["per_rank"][str(rank)] == max(s["peak_rss_bytes"] for s in stats[rank::2])
    assert peak["max"] == max(peak["per_part"])
    # Both workers ran in this process: its peak, read independently, bounds theirs.
    mine = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert 10_000_000 < peak["per_rank"]["0"] <= peak["per_rank"]["1"] <= mine


def test_peak_rss_summary_of_parts_without_a_record():
    """Parts of a build from before peaks were recorded are unknown, not zero."""
    stats = [
        {"rank": 0, "peak_rss_bytes": 300},
        {"rank": 1},
        {"rank": 0, "peak_rss_bytes": 500},
        {"rank": 1, "peak_rss_bytes": 200},
    ]
    assert peak_rss_summary(stats) == {"max": 500, "per_rank": {"0": 500, "1": 200}, "per_part": [300, None, 500, 200]}
    assert peak_rss_summary([{"rank": 0}]) == {"max": None, "per_rank": {}, "per_part": [None]}
