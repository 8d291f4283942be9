"""`counterfactory publish-metric`: a metric module published as a tagged Space on the local Hub
loads with `evaluate.load("ORG/NAME", revision=...)` and computes what the package function does."""

from __future__ import annotations

from pathlib import Path

import evaluate
import numpy as np
import pytest
from huggingface_hub import HfApi

from builders.infra.cli import main as cli_main
from builders.infra.errors import UserFacingError
from metric_spaces.odmap.odmap_scores import odmap_from_topk
from builders.infra.publishing.metric import MetricPublishConfig, publish_metric

MODULES = Path(__file__).resolve().parents[1] / "metric_spaces"


def test_published_metric_loads_by_tag_from_the_hub(local_hub, capsys):
    assert cli_main(["publish-metric", str(MODULES / "odmap"), "--repo-id", "tester/odmap",
                     "--version", "v1.0.0"]) == 0
    assert "evaluate.load('tester/odmap', revision='v1.0.0')" in capsys.readouterr().out
    files = {f.path for f in HfApi().list_repo_tree("tester/odmap", repo_type="space",
                                                      revision="v1.0.0")}
    assert {"odmap.py", "README.md", "app.py", "requirements.txt"} <= files

    module = evaluate.load("tester/odmap", revision="v1.0.0")
    rng = np.random.default_rng(0)
    mentions = rng.random((50, 3)) < 0.4
    topk = rng.integers(50, size=(8, 5))
    removed, present = [["cat"]] * 8, [["dog", "car"]] * 8
    got = module.compute(retrieved=topk, removed_classes=removed, present_classes=present,
                         mention_matrix=mentions, class_names=["cat", "dog", "car"], k_values=[1, 5])
    expected = odmap_from_topk(topk, mentions, np.array([[True, False, False]] * 8),
                               np.array([[False, True, True]] * 8), k_values=(1, 5)).as_dict()
    assert got == {**expected, "num_queries": 8}

    with pytest.raises(UserFacingError, match="already has tag v1.0.0"):
        publish_metric(MetricPublishConfig(MODULES / "odmap", "tester/odmap", "v1.0.0"))


def test_repo_name_must_match_the_module_file(local_hub):
    with pytest.raises(UserFacingError, match=r"fetches odmap-metric.py.*found \[.*'odmap.py'"):
        publish_metric(MetricPublishConfig(MODULES / "odmap", "tester/odmap-metric", "v1.0.0"))
