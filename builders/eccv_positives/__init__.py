"""ECCV Caption positives: the published annotations as a dataset, and the machine-in-the-loop
(MITL) tooling that builds new versions (Chun et al., ECCV 2022; notes in METHOD.md).

Import: flags (`options.py`) → `EccvImportConfig` and the paper's constants (`config.py`) →
`eccv_caption` annotation files, MITL report and optional COCO root (`source.py`: sources,
provenance labels, counts) → the tables i2t, t2i, pm, removed (`schema.py`) → card fields
(`card.py`) and gallery view (`view.py`) → `builder.py` (the sharded builder and the
`accelerate launch` entry point) → Hub-layout parquet. New versions: `mitl/` (candidates, tasks,
human verdicts, ingest, model bias and the `counterfactory eccv ...` commands), which writes
annotation files this builder reads.
"""
