"""ECCV Caption positives: the published annotations as a dataset, and the machine-in-the-loop
(MITL) tooling that builds new versions (Chun et al., ECCV 2022; notes in METHOD.md).

Import: `eccv_caption` annotation files (+ optional COCO root) → `annotations.py` (sources,
provenance labels, the paper's removal list, counts) → `builder.py` (configs i2t, t2i, pm,
removed; options in the light `options.py`, card fields in `card.py`, gallery view in `view.py`)
→ Hub-layout parquet.
New versions: a COCO-style gallery → `candidates.py` (machine annotators embed it once, cached by
`embeddings.py`; streaming top-k per sampled query; union with per-model ranks) → `tasks.py`
(18 candidates + 1 golden positive + 1 golden negative per task; Label Studio JSON and CSV) →
human verdicts → `ingest.py` (quality control on the goldens, majority vote, invalid captions
removed, merge with CxC and COCO; positives in the `eccv_caption` format, built by the same
builder) → `model_bias.py` (models ranked by mAP@R on single-annotator positive sets).
`cli.py` holds the `counterfactory eccv ...` subcommands.
"""
