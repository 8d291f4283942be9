"""The metric Spaces: each folder is one `evaluate` module that loads on its own.

`evaluate.load("ORG/NAME")` downloads `NAME.py` from the Space and every helper file `NAME.py`
imports relatively (`from .helper import x`); it does not follow the helpers' own imports. So a
folder holds `NAME.py`, the helper modules it imports (each of them imported by `NAME.py` itself),
`README.md` and a `requirements.txt` of PyPI packages (no torch, no counterfactory). The helpers
are the implementation: builders, training, tests and benchmarks import them from here
(`from metric_spaces.odmap.odmap_scores import odmap_from_topk`), and `counterfactory
publish-metric` uploads the same files, so the Space runs exactly the project's code.
A helper two Spaces need keeps one home; the other Space's folder holds a symlink to it, and
`publish-metric` uploads its content (no hand-kept copies).

The folder is not called `evaluate_modules`: that is the name of the package into which
`evaluate` imports every loaded module, and an importable folder of that name shadows it.
"""
