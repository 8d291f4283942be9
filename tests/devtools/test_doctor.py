"""`counterfactory doctor` (builders/devtools/doctor.py) and `benchmarks/gpu_check.py` without a GPU.

The doctor runs every stage on the tiny profile (the same families at reduced depth: CI time) and
one stage on a production architecture at its real size (CLIP ViT-B/32, the trainer's model);
the full production run is quoted in the README. The batch-size extrapolation is checked against
arithmetic written out here, not against the module's own formula.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from builders.app.cli import main as cli_main
from builders.devtools.doctor_stages import STAGE_NAMES

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

REPO = Path(__file__).resolve().parents[2]


def _doctor(tmp_path: Path, tiny_models_dir: Path, *extra: str) -> dict:
    out = tmp_path / "doctor.json"
    assert cli_main(["doctor", "--tiny-models-dir", str(tiny_models_dir), "--json", str(out),
                     *extra]) == 0
    return json.loads(out.read_text())


def _check_rows(report: dict, stages) -> None:
    assert [r["stage"] for r in report["rows"]] == list(stages)
    for row in report["rows"]:
        assert row["seconds"] > 0 and row["weights_mib"] > 0, row
        assert row["peak_mib"] > 0 and row["activation_mib_per_item"] > 0, row
        assert sorted(row["batch_fp16"], key=int) == ["24", "40", "80"], row
        batches = [row["batch_fp16"][g] for g in ("24", "40", "80")]
        # More memory never fits a smaller batch.
        assert all(isinstance(b, int) and b >= 0 for b in batches) and batches == sorted(batches), row


def test_doctor_runs_every_stage_on_the_tiny_profile(tmp_path, tiny_models_dir, nltk_data_dir, capsys):
    report = _doctor(tmp_path, tiny_models_dir, "--models", "tiny", "--resolution", "64", "--steps", "1")
    _check_rows(report, STAGE_NAMES)
    assert report["extrapolated_from"] == "CPU fp32"
    printed = capsys.readouterr().out
    assert "extrapolated from CPU fp32" in printed
    assert all(name in printed for name in STAGE_NAMES)
    p2p = {r["stage"]: r for r in report["rows"]}["p2p-cross"]
    # One candidate pair, one step: original + counterfactual x guidance halves = 4 UNet rows.
    assert "4 UNet rows" in p2p["note"] and "activations x64 to 512 px" in p2p["note"]


def test_doctor_production_architecture_at_real_size(tmp_path, tiny_models_dir, nltk_data_dir):
    report = _doctor(tmp_path, tiny_models_dir, "--stages", "train-vit-b32")
    _check_rows(report, ["train-vit-b32"])
    row = report["rows"][0]
    # openai/clip-vit-base-patch32: 151,277,313 parameters in fp32.
    assert row["weights_mib"] == pytest.approx(151_277_313 * 4 / 2**20, abs=0.1)
    # Mixed-precision training holds 16 bytes per parameter (2.25 GiB): it fits every GPU listed.
    assert row["batch_fp16"]["24"] > 0


def test_fitting_batch_arithmetic():
    from builders.devtools.doctor import fitting_batch

    gib = 2**30
    # 24 GiB x 0.9 = 21.6 GiB; minus 1.6 GiB of weights = 20 GiB; 0.5 GiB per item -> 40.
    assert fitting_batch(24, 1.6 * gib, 0.5 * gib) == 40
    # Weights larger than the usable memory: nothing fits.
    assert fitting_batch(24, 30 * gib, 1) == 0


def test_doctor_unknown_stage_is_one_line(capsys):
    assert cli_main(["doctor", "--stages", "p2p-self,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown stage(s) nope" in err[0] and "p2p-self" in err[0]


def test_gpu_check_without_cuda_says_so_and_exits_0():
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA device" in proc.stdout and "nothing run" in proc.stdout
