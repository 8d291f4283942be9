"""Machine-in-the-loop (MITL) rounds that make a new ECCV Caption-style version (METHOD.md §2 to §5).

A COCO-style gallery (`image_gallery.py`) → `candidates.py` (machine annotators embed it once,
cached by `embeddings.py`; streaming top-k per sampled query; union with per-model ranks) →
`tasks.py` (18 candidates + 1 golden positive + 1 golden negative per task; Label Studio JSON
and CSV) → human verdicts → `ingest.py` (quality control on the goldens, majority vote, invalid
captions removed, merge with CxC (`cxc.py`) and COCO; positives in the `eccv_caption` format,
built by the package's import builder) → `model_bias.py` (models ranked by mAP@R on
single-annotator positive sets). `cli.py` holds the `counterfactory eccv ...` subcommands.
"""
