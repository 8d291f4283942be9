"""counterfactory: build, publish and evaluate datasets that expose spurious correlations in
image-text retrieval (COCO-Counterfactuals, object-decorrelation sets, ECCV Caption positives).

`builders` is the application package. The design fixes the top-level names (`accelerate launch
builders/<dataset>/builder.py`), so this one package holds the whole application as layers, each
importing only the layers below it (tests/house/test_layers.py): the engine at the bottom
(`builders.engine`: runner, errors, provenance), then models, viewer, publishing, `launch` and the
dataset packages (`coco_captions`, `decorrelation`, `counterfactuals`, `eccv_positives`), then the
top-level `training` package, `devtools`, and the app at the top (`builders.app`: the
`counterfactory` command). This module itself holds only `__version__`, at the engine's level.
docs/architecture.md has the whole map.
"""

__version__ = "0.1.0"
