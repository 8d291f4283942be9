"""`make demo` runs `python -m builders.infra.demo`: the whole pipeline on the fixture, offline."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


def test_demo_runs_end_to_end(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "builders.infra.demo", "--workdir", str(tmp_path / "demo")],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "demo" / "demo_summary.json").read_text())
    steps = summary["steps"]
    assert {"fixture", "nltk", "tiny models", "build coco-captions",
            "publish + load coco-captions", "publish + load metric odmap"} <= set(steps)
    assert steps["publish + load coco-captions"]["rows"]["default/test"] > 0
    assert steps["publish + load metric odmap"]["odmap_example"]["ODmAP@1"] == 0.5
    # Every registered builder is part of the demo.
    from builders.registry import BUILDER_MODULES

    assert {f"build {name}" for name in BUILDER_MODULES} <= set(steps)
    # What it publishes names no directory of this machine (models, sources, the tagger).
    local = {str(tmp_path), str(Path.home()), str(Path(__file__).resolve().parents[1]),
             tempfile.gettempdir()}
    for build in (tmp_path / "demo" / "builds").iterdir():
        for name in ("README.md", "build_manifest.json"):
            text = (build / name).read_text()
            assert not [d for d in local if d in text], f"{build.name}/{name} names a local directory"
