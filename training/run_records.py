"""What a run records in its folder (training/run_folder.py lists them): `run.json` as published
(no local path), `loss.jsonl` and `metrics.jsonl` (one record per step, cut back to the resumed
step), `metrics.md` (the final table and the before -> after table)."""

from __future__ import annotations

import json
from pathlib import Path

from builders.engine.provenance import portable
from training.checkpoint import final_tables
from training.config import TrainConfig
from training.run_root import RunRoot


def published_record(record: dict, cfg: TrainConfig, output: Path) -> dict:
    """The run record as run.json and the model card (pushed with the model) state it: no local
    path. The model (and a checkpoint file given as the open_clip tag) is named as every record
    names models (`provenance.model_name`: `local:NAME@sha256:...` for a local folder, however
    spelled), and --first-stage's; a local dataset folder likewise (Hub datasets keep their id,
    revision and commit); any other absolute path as the build manifests name it, the output
    folder as `.`."""
    sources = [ref.path for ref in (cfg.data.real, cfg.data.decorrelation, cfg.data.counterfactuals) if ref]
    local = [path for path in sources if Path(path).exists()]
    return portable(record, output, inputs=[cfg.run.model, cfg.run.pretrained, cfg.run.first_stage, *local])


def read_jsonl(path: Path, upto_step: int) -> list[dict]:
    """Records up to the resumed step (a killed run may have logged past its last checkpoint)."""
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["step"] <= upto_step]


def write_jsonl(root: RunRoot, rel: str, rows: list[dict]) -> None:
    root.write_text(rel, "".join(json.dumps(r) + "\n" for r in rows))


def write_results(root: RunRoot, record: dict, evals: list[dict], final: dict[str, float]) -> None:
    """metrics.jsonl, metrics.md and run.json, each written whole below the run folder's
    descriptor (training/run_root.py: never through a link)."""
    write_jsonl(root, "metrics.jsonl", evals)
    root.write_text("metrics.md", final_tables(record, final))
    root.write_text("run.json", json.dumps({**record, "final_metrics": final}, indent=1))
