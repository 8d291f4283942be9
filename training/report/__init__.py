"""`counterfactory benchmark`: how much CLIP models rely on spurious correlations, on our datasets.

models.py (which model, loaded by the trainer's backends, and its weights digest) -> datasets.py
(each build opened once with the trainer's evaluation loaders) -> run.py (every model x dataset
scored by `training.evaluation.evaluate_model`, the code `--eval-only` runs) -> results.py
(`results.jsonl`, clip-benchmark-like records) -> markdown.py (`report.md`); a renderings
dataset's generators are compared on their common pairs by generator_bias.py.
"""
