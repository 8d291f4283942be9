"""Shared by the builder tests: multi-process launches, killing a build mid-way, shard digests,
and the fixture cases and builds of the bad-input tests (test_path_containment.py,
test_bad_inputs_images.py)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq

from builders.app.cli import main as cli_main
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture

ACCELERATE = Path(sys.executable).parent / "accelerate"


def accelerate_cmd(script: Path, *args: str, processes: int = 2) -> list[str]:
    """`accelerate launch` with N CPU processes: `--cpu` would start only one (accelerate 1.15.0's
    `launch_command` sends `--cpu` to its single-process `simple_launcher`), so this uses the
    multi-GPU launcher, and the builders ask accelerate for the CPU themselves. Port 0: a free
    port, so launches of concurrent test workers never meet on accelerate's default 29500."""
    return [
        str(ACCELERATE),
        "launch",
        "--multi_gpu",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--main_process_port",
        "0",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(script),
        *args,
    ]


def shard_digests(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((root / "data").rglob("*.parquet"))
    }


def kill_after_parts(cmd: list[str], stats_dir: Path, min_parts: int, timeout: float, poll: float) -> int:
    """Start `cmd`, SIGKILL it and every process it started once `min_parts` parts have finished,
    and return how many had finished by then."""
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + timeout
    while time.time() < deadline and len(list(stats_dir.glob("*.json"))) < min_parts:
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        time.sleep(poll)
    kill_tree(proc)
    return len(list(stats_dir.glob("*.json")))


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL `proc` (started with `start_new_session=True`) and every process it started, and
    wait until all of them are gone: a forked child (a DataLoader worker) shares the parent's
    lock descriptors, so the output folder is free only once the last one has exited."""
    # torch's elastic agent (behind `accelerate launch`) starts each worker in a session of its
    # own: killing the launcher's group alone would leave the workers building and merging.
    tree = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    for child in tree:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=60)
    proc.wait()


def error_line(capsys) -> str:
    """The one `counterfactory: error:` line a failed command printed (and no traceback)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("counterfactory: error:")]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------------------ bad-input cases


def fixture_case(base: Path) -> dict[str, Any]:
    """An 8-image COCO fixture under `base` and the image the cases break (a test-split image)."""
    root = write_coco_fixture(base / "coco", CocoFixtureConfig(n_images=8))
    karpathy = json.loads((root / "dataset_coco.json").read_text())["images"]
    target = sorted(e["cocoid"] for e in karpathy if e["split"] == "test")[1]
    entry = next(e for e in karpathy if e["cocoid"] == target)
    return {
        "root": root,
        "target": target,
        "folder": entry["filepath"],
        "image": root / entry["filepath"] / entry["filename"],
        "size": (128, 96),
    }


def table_images_argv(captions_from: str | Path, tiny: Path, out: Path, *extra: str) -> list[str]:
    """`counterfactory build coco-counterfactuals --stage images --captions-from TABLE` with the tiny
    models into `out`: the argv every caption-pair-table test starts from."""
    return [
        *("build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(captions_from)),
        *("--models", "tiny", "--tiny-models-dir", str(tiny), "--output", str(out)),
        *extra,
    ]


def captions_build(root: Path, out: Path) -> int:
    return cli_main(
        [
            "build",
            "coco-captions",
            "--coco-root",
            str(root),
            "--splits",
            "test",
            "val",
            "--output",
            str(out),
            "--part-size",
            "2",
            "--max-error-fraction",
            "0.5",
        ]
    )


def decorrelation_build(root: Path, out: Path, models: Path, *source: str) -> int:
    """The tiny-profile decorrelation build of a COCO root (or of `source` options)."""
    return cli_main(
        [
            "build",
            "decorrelation",
            *(source or ("--coco-root", str(root))),
            "--output",
            str(out),
            "--models",
            "tiny",
            "--tiny-models-dir",
            str(models),
            "--fill",
            "zero",
            "--image-size",
            "64",
            "--part-size",
            "2",
            "--max-error-fraction",
            "0.9",
        ]
    )


def eccv_build(root: Path, out: Path) -> int:
    return cli_main(
        [
            "build",
            "eccv-positives",
            "--coco-root",
            str(root),
            "--output",
            str(out),
            "--part-size",
            "8192",
            "--max-error-fraction",
            "0.5",
        ]
    )


def errors_everywhere(out: Path) -> tuple[dict, dict]:
    """The manifest's input errors and the sum of the per-part stats files' errors."""
    manifest = json.loads((out / "build_manifest.json").read_text())["errors"]
    parts: dict[str, int] = {}
    for path in (out / ".parts/stats").glob("*.json"):
        for reason, n in json.loads(path.read_text()).get("errors", {}).items():
            parts[reason] = parts.get(reason, 0) + n
    return manifest, parts


def without_target(rows: dict[str, list[dict]], target: int) -> dict[str, list[dict]]:
    """Every output's rows but those of image `target`."""
    return {key: [r for r in rs if r.get("image_id") != target] for key, rs in rows.items()}


def rows_by_output(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Every published row, read straight from the shards (images as their embedded bytes)."""
    manifest = json.loads((out / "build_manifest.json").read_text())
    return {
        key: [row for shard in o["shards"] for row in pq.read_table(out / shard).to_pylist()]
        for key, o in manifest["outputs"].items()
    }
