"""Start-up of the trainer (#44): a run imports nothing it does not use. A train-only run (no
evaluation set) makes no interval, so it must not pay for the statistics' scipy.special (0.25 s,
a twentieth of open_clip_train's whole fixed part; benchmarks/trainer_startup.py), nor for the
report's or the builders' heavy libraries."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from builders.app.cli import main as cli_main

from helpers.training_helpers import PYTHON, REPO_ROOT, SCRIPT

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

#: Imported by nothing a train-only run does (statistics: only where an interval is made).
UNUSED = ("scipy.special", "scipy.stats", "matplotlib", "sentence_transformers", "diffusers", "nltk", "evaluate")


def test_train_only_run_imports_no_statistics_or_report_library(tmp_path, coco_fixture_dir, tiny_models_dir):
    from builders.models.profiles import tiny_profile

    cc, out = tmp_path / "cc", tmp_path / "run"
    argv = ["build", "coco-captions", "--coco-root", str(coco_fixture_dir), "--splits", "train", "restval"]
    assert cli_main([*argv, "--output", str(cc)]) == 0
    model = tiny_profile(tiny_models_dir).open_clip
    run = [PYTHON, str(SCRIPT), "--real", str(cc), "--real-test-split", "", "--real-val-split", ""]
    run += ["--backend", "open_clip", "--model", model, "--batch-size", "4", "--max-steps", "2"]
    run += ["--num-workers", "0", "--report-to", "none", "--output", str(out)]
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    proc = subprocess.run(run, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "final").is_dir()  # it trained and saved the model: the run was a real one
    # Trace lines look like "import time:   123 |   456 |   scipy.special".
    imported = set(re.findall(r"^import time:.*\|\s*([\w.]+)\s*$", proc.stderr, re.M))
    assert "torch" in imported and "datasets" in imported  # the trace is the run's
    # A package or any of its modules (`from scipy import special` traces only scipy.special._*).
    assert sorted(u for u in UNUSED if any(m == u or m.startswith(u + ".") for m in imported)) == []
