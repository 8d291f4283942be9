"""Sharded, resumable dataset building shared by every builder.

Module map:
- `base`: the `ShardedBuilder` protocol builders implement, and the `Emit` / `Skip` records.
- `layout`: where parts, stats, shards and the manifest live in an output folder.
- `part_writer`: writes one part's rows as parquet (temp name, then rename; stats last).
- `runner`: assigns parts to processes, skips finished parts, reports progress and failures.
- `merge`: turns finished parts into the Hub layout (`data/*.parquet`, README configs, manifest).
"""
