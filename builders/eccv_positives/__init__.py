"""ECCV Caption positives: the published annotations as a dataset, and the machine-in-the-loop
(MITL) tooling that builds new versions (Chun et al., ECCV 2022; notes in METHOD.md).

Import: `eccv_caption` annotation files (+ optional COCO root) → `annotations.py` (sources,
provenance labels, the paper's removal list, counts) → `builder.py` (configs i2t, t2i, pm,
removed; card via `card.py`) → Hub-layout parquet. New versions: a COCO-style gallery →
`candidates.py` (machine annotators embed it once, cached in `embeddings.py`; streaming top-k per
sampled query; union with per-model ranks) → `tasks.py` (tasks of 18 candidates + 1 golden positive
+ 1 golden negative; Label Studio JSON and CSV) → human verdicts → `ingest.py` (quality control on
the goldens, majority vote, invalid captions removed, merge with CxC and COCO; writes positives in
the `eccv_caption` format, then runs the same builder) → `model_bias.py` (models ranked by mAP@R on
single-annotator positive sets). `cli.py` holds the `counterfactory eccv ...` subcommands.
"""
