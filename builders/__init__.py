"""counterfactory: build, publish and evaluate datasets that expose spurious correlations in
image-text retrieval (COCO-Counterfactuals, object-decorrelation sets, ECCV Caption positives)."""

__version__ = "0.1.0"
