"""Sharded, resumable dataset building shared by every builder.

Module map:
- `base`: the `ShardedBuilder` protocol builders implement, and the `Emit` / `Skip` records.
- `layout`: where parts, stats, shards and the manifest live in an output folder, and
  `OutputLayout.out`, the output root opened once: the one way to write or delete below it.
- `part_writer`: writes one part's rows as parquet (temp name, then rename; stats last, with each
  part file's sha256).
- `part_files`: reads parts and stats files back without trusting them (regular files inside the
  output, never through a symlink; a part's bytes must match its stats).
- `inputs`: what each part was built from (a resume refuses changed inputs), repeated ids, and
  items the reader marked malformed (counted input-error skips).
- `output_guard`: the output folder's lock, one-line OS errors, removal of stale `.tmp` files.
- `resume`: the run fingerprint, and whether finished parts match the inputs read now.
- `shares`: one pass over the inputs keeping this process's parts; no input, or processes that
  read different inputs, is an error.
- `run_config`: `BuildRunConfig`, how a build runs; its fields are every builder's run flags.
- `runner`: assigns parts to processes, skips finished parts, reports progress and failures.
- `merge`: turns finished parts into the Hub layout (`data/*.parquet`, README configs, manifest).
- `build_files`: the files of a build (the manifest's `files`) and what else its folder may hold;
  what `publish` sends and `--overwrite` deletes.
"""
