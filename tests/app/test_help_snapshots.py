"""Every `--help` of the builders and the trainer, against the snapshots in tests/app/snapshots/help/.

The flags are generated from typed config fields (`builders.engine.options`), so a change to a
field's default, type or help text changes `--help`: these snapshots make every such change a
reviewed diff. Each output is regenerated in a fresh interpreter with `COLUMNS=100`, so argparse
wraps it the same on every terminal and machine.

Regenerate after an intended change, and review the diff:

    UPDATE_HELP_SNAPSHOTS=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/app/test_help_snapshots.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots" / "help"
CLI = "import sys; from builders.app.cli import main; sys.exit(main(sys.argv[1:]))"
DATASETS = {
    "coco-captions": "coco_captions",
    "coco-counterfactuals": "counterfactuals",
    "decorrelation": "decorrelation",
    "eccv-positives": "eccv_positives",
}

#: Snapshot name -> the command line (run from the repository root) whose `--help` it holds.
COMMANDS: dict[str, list[str]] = {
    "counterfactory-build": ["-c", CLI, "build"],
    **{f"counterfactory-build-{name}": ["-c", CLI, "build", name] for name in DATASETS},
    # accelerate launch runs the script with the same interpreter: its help is the script's.
    **{f"builder-{name}": [f"builders/{package}/builder.py"] for name, package in DATASETS.items()},
    # --dtype, --models and --tiny-models-dir outside the builders.
    "counterfactory-eccv-candidates": ["-c", CLI, "eccv", "candidates"],
    "counterfactory-eccv-model-bias": ["-c", CLI, "eccv", "model-bias"],
    "counterfactory-train": ["-c", CLI, "train"],
    "counterfactory-sweep": ["-c", CLI, "sweep"],
    "finetune_clip": ["training/finetune_clip.py"],
    "sweep": ["training/sweep.py"],
}


def _help(argv: list[str]) -> str:
    env = {**os.environ, "COLUMNS": "100", "LINES": "50"}
    proc = subprocess.run(
        [sys.executable, *argv, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.parametrize("name", sorted(COMMANDS))
@pytest.mark.slow
def test_help_matches_snapshot(name):
    text, path = _help(COMMANDS[name]), SNAPSHOTS / f"{name}.txt"
    if os.environ.get("UPDATE_HELP_SNAPSHOTS"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no snapshot {path.name}: run with UPDATE_HELP_SNAPSHOTS=1 and review it"
    assert text == path.read_text(), (
        f"`{' '.join(COMMANDS[name])} --help` changed; if intended, "
        "regenerate (UPDATE_HELP_SNAPSHOTS=1) and review the diff"
    )


def test_every_builder_has_snapshots():
    """A dataset added to the registry gets its snapshots too."""
    from builders.app.registry import BUILDER_MODULES

    assert set(BUILDER_MODULES) == set(DATASETS)
