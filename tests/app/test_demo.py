"""`make demo` runs `python -m builders.app.demo`: the whole pipeline on the fixture, offline."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

#: What a swapped word may be: a plain word, possibly hyphenated or with an apostrophe.
WORD = re.compile(r"\w+(?:[-'’]\w+)*")
#: The image filters of the COCO-Counterfactuals card -> the option holding each threshold.
FILTER_THRESHOLDS = {
    "text_image": "clip_threshold",
    "image_image": "image_similarity_threshold",
    "directional": "directional_threshold",
}


def caption_pairs(build: Path) -> list[dict]:
    """Every caption pair of every config of a coco-counterfactuals build."""
    columns = ["caption_0", "caption_1", "replaced_word", "replacement_word", "replaced_position"]
    return [
        row
        for shard in sorted((build / "data").rglob("*.parquet"))
        for row in pq.read_table(shard, columns=columns).to_pylist()
    ]


def card_table_row(card: str, first_cell: str) -> dict[str, str]:
    """The cells of the card's table row starting with `first_cell`, keyed by its header."""
    lines = card.splitlines()
    k = next(k for k, line in enumerate(lines) if line.startswith(f"| {first_cell} |"))
    start = k
    while lines[start - 1].startswith("|"):  # back up to the table's header line
        start -= 1

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    return dict(zip(cells(lines[start]), cells(lines[k]), strict=True))


def test_demo_runs_end_to_end(tmp_path, real_home):
    proc = subprocess.run(
        [sys.executable, "-m", "builders.app.demo", "--workdir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    demo = (tmp_path / "demo").resolve()
    summary = json.loads((demo / "demo_summary.json").read_text())
    steps = summary["steps"]
    assert {
        "fixture",
        "nltk",
        "tiny models",
        "build coco-captions",
        "publish + load coco-captions",
        "publish + load metric odmap",
        "gallery",
    } <= set(steps)
    assert steps["publish + load coco-captions"]["rows"]["default/test"] > 0
    assert steps["publish + load metric odmap"]["odmap_example"]["ODmAP@1"] == 0.5
    # Every registered builder is part of the demo.
    from builders.app.registry import BUILDER_MODULES

    assert {f"build {name}" for name in BUILDER_MODULES} <= set(steps)
    # What it publishes names no directory of this machine (models, sources, the tagger).
    local = {
        str(tmp_path),
        str(Path.home()),
        str(real_home),
        str(Path(__file__).resolve().parents[2]),
        tempfile.gettempdir(),
    }
    for build in (demo / "builds").iterdir():
        for name in ("README.md", "build_manifest.json"):
            text = (build / name).read_text()
            assert not [d for d in local if d in text], f"{build.name}/{name} names a local directory"

    # The gallery step: one complete gallery per build, linked from the page the demo prints.
    index = demo / "gallery" / "index.html"
    assert Path(steps["gallery"]["gallery"]) == index
    assert f"browse the demo builds: open {index}" in proc.stdout.splitlines()
    links = set(re.findall(r'href="([^"]+)"', index.read_text()))
    for name in BUILDER_MODULES:
        gallery = json.loads((demo / "gallery" / name / "gallery.json").read_text())
        outputs = json.loads((demo / "builds" / name / "build_manifest.json").read_text())["outputs"]
        rows = outputs[f"{gallery['config']}/{gallery['split']}"]["rows"]
        assert gallery["complete"] and gallery["rows"] == rows > 0, (name, gallery)
        assert f"{name}/index.html" in links and (demo / "gallery" / name / "index.html").is_file()

    # The finetuning run (5 steps under `accelerate launch`) and the report of the base and the
    # finetuned model, their paths the demo's last lines; the run's metrics carry the names of
    # the report's records (one vocabulary).
    metrics, report = demo / "runs" / "finetune" / "metrics.md", demo / "report" / "report.md"
    assert proc.stdout.splitlines()[-2:] == [
        f"the finetuning run's metrics: {metrics}",
        f"the model report (base and finetuned CLIP, tiny BLIP ITM): {report}",
    ]
    run = json.loads((demo / "runs" / "finetune" / "run.json").read_text())
    assert run["steps"] == 5 and run["processes"] == 1
    records = [json.loads(line) for line in (demo / "report" / "results.jsonl").read_text().splitlines()]
    scored = {r["model"] for r in records if r["task"] != "blind_baseline"}
    assert len(scored) == 3 and report.is_file() and metrics.is_file()
    # The tiny cross-encoder's ITM deltas are its own G (BLIP's ITM logit), beside the CLIPs'.
    itm = {r["model"]: r.get("g_kind") for r in records if r["task"] == "itm"}
    assert sorted(itm.values()) == ["blip_itm_logit", "cosine", "cosine"], itm
    # Each model is named by where it came from: the finetuned one by its base and run folder,
    # not only by its folder's name and digest.
    text = report.read_text()
    base = next(r["model"] for r in records if r["model"].startswith("local:clip@"))
    tuned = next(r["model"] for r in records if r["model"].startswith("local:final@"))
    assert f"- {tuned}: finetuned from {base} for 5 steps (run folder finetune, its final/)" in text, text[:3000]
    assert f"- {base}: tiny random-init clip (counterfactory models tiny)" in text
    assert "tiny random-init blip (counterfactory models tiny)" in text
    reported = {f"{r['task']}/{name}" for r in records for name in r["metrics"]}
    assert "zeroshot_retrieval/text_retrieval_recall@5" in reported
    assert set(run["final_metrics"]) - {"val_loss"} <= reported, set(run["final_metrics"]) - reported

    # Every caption pair is a one-word edit: cutting the swapped word out of each caption at
    # replaced_position leaves the same text.
    cf = demo / "builds" / "coco-counterfactuals"
    pairs = caption_pairs(cf)
    assert pairs
    for row in pairs:
        old, new, at = row["replaced_word"], row["replacement_word"], row["replaced_position"]
        assert WORD.fullmatch(old) and WORD.fullmatch(new) and old != new, row
        assert row["caption_0"][at : at + len(old)] == old and row["caption_1"][at : at + len(new)] == new, row
        assert (
            row["caption_0"][:at] + row["caption_0"][at + len(old) :]
            == row["caption_1"][:at] + row["caption_1"][at + len(new) :]
        ), row
    # The card lists the three image filters with the thresholds the build used.
    images = json.loads((cf / "build_manifest.json").read_text())["config"]["images"]
    card = (cf / "README.md").read_text()
    for name, option in FILTER_THRESHOLDS.items():
        row = card_table_row(card, f"`{name}`")
        assert float(row["threshold"]) == images[option], (name, row)
        assert row["applied"] == ("yes" if name in images["filters"] else "no"), (name, row)
