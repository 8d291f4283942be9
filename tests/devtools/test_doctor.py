"""`counterfactory doctor` (builders/devtools/doctor.py) and `benchmarks/gpu_check.py` without a GPU.

The doctor runs every stage on the tiny profile (the same families at reduced depth: CI time) and
one stage on a production architecture at its real size (CLIP ViT-B/32, the trainer's model);
the full production run is quoted in docs/production.md. The batch-size extrapolation is checked against
arithmetic written out here, not against the module's own formula.

The generator rows (builders/devtools/doctor_generators.py) run on the meta device for the big
models (SDXL, SD3, FLUX: seconds, no memory) and are measured for SD v1.5 at 64 px; which of the
two a row uses is forced through the free memory the doctor sees, so the test does not depend on
this machine's.
"""

from __future__ import annotations

import json
import re
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
    assert cli_main(["doctor", "--tiny-models-dir", str(tiny_models_dir), "--json", str(out), *extra]) == 0
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
    report = _doctor(
        tmp_path, tiny_models_dir, "--models", "tiny", "--resolution", "64", "--steps", "1", "--generators", "none"
    )
    _check_rows(report, STAGE_NAMES)
    assert report["extrapolated_from"] == "CPU fp32"
    printed = capsys.readouterr().out
    assert "extrapolated from CPU fp32" in printed
    assert all(name in printed for name in STAGE_NAMES)
    p2p = {r["stage"]: r for r in report["rows"]}["p2p-cross"]
    # One candidate pair, one step: original + counterfactual x guidance halves = 4 UNet rows.
    assert "4 UNet rows" in p2p["note"] and "activations x64 to 512 px" in p2p["note"]


def test_doctor_production_architecture_at_real_size(tmp_path, tiny_models_dir, nltk_data_dir):
    report = _doctor(tmp_path, tiny_models_dir, "--stages", "train-vit-b32", "--generators", "none")
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
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA device" in proc.stdout and "nothing run" in proc.stdout


# -- generator rows ------------------------------------------------------------------------------

#: Distinct parameters per generator, from the published counts (tests/models/test_production_shapes.py
#: checks each component against its source): denoiser, text encoders, VAE.
PARAMS = {
    "sd15": 859_520_964 + 123_060_480 + 83_653_863,
    "sdxl": 2_567_463_684 + 123_060_480 + 694_659_840 + 83_653_863,
    "sd3": 2_028_328_000 + 123_060_480 + 768 * 768 + 694_659_840 + 4_762_310_656 + 83_819_683,
    "flux": 11_891_178_560 + 123_060_480 + 4_762_310_656 + 83_819_683,
}
GIB = 2**30


def _generator_rows(tmp_path, monkeypatch, free_gib: float, *args: str) -> tuple[dict, str]:
    from builders.devtools import doctor_generators

    monkeypatch.setattr(doctor_generators, "free_bytes", lambda device: free_gib * GIB)
    out = tmp_path / "doctor.json"
    assert cli_main(["doctor", "--stages", "", "--json", str(out), *args]) == 0
    report = json.loads(out.read_text())
    assert report["rows"] == []
    return {r["generator"]: r for r in report["generators"]}, out


def test_doctor_generator_rows_on_the_meta_device(tmp_path, monkeypatch, capsys):
    rows, _ = _generator_rows(tmp_path, monkeypatch, 4, "--generators", "sd15,sdxl,sd3,flux")
    printed = capsys.readouterr().out
    assert list(rows) == ["sd15", "sdxl", "sd3", "flux"]
    for name, row in rows.items():
        # 4 GiB free: not even SD v1.5's 4 GiB of fp32 weights fit in half of it.
        expect = "meta-device arithmetic"
        assert row["how"].startswith(expect), row
        assert row["weights_gib"]["fp32"] == pytest.approx(PARAMS[name] * 4 / GIB, abs=0.01), name
        assert row["weights_gib"][row["dtype"]] == pytest.approx(PARAMS[name] * 2 / GIB, abs=0.01)
        assert row["resolution"] == (512 if name == "sd15" else 1024)
        assert row["activation_mib_per_pair"] == max(row["denoiser_mib_per_pair"], row["decode_mib_per_pair"])
        for batch in (row["batch"], row["batch_cpu_offload"]):
            assert sorted(batch, key=int) == ["24", "40", "80"]
            assert [batch[g] for g in ("24", "40", "80")] == sorted(batch.values())
        # Offloading never fits fewer pairs than keeping every component on the GPU.
        assert all(row["batch_cpu_offload"][g] >= row["batch"][g] for g in row["batch"])
        assert name in printed and row["model"] in printed
    assert "exceed half of the 4.0 GiB free" in rows["flux"]["how"]
    assert rows["sd3"]["rows_per_pair"] == rows["sdxl"]["rows_per_pair"] == 4  # guidance halves
    flux = rows["flux"]
    assert flux["dtype"] == "bf16" and flux["rows_per_pair"] == 2  # schnell: no guidance
    # FLUX in bf16: 31.4 GiB of weights exceed 90% of a 24 GB GPU, and on it even the transformer
    # alone (11,891,178,560 x 2 bytes = 22.1 GiB) exceeds 21.6 GiB: not even with --cpu-offload.
    assert PARAMS["flux"] * 2 > 24 * 0.9 * GIB and 11_891_178_560 * 2 > 24 * 0.9 * GIB
    assert flux["batch"]["24"] == flux["batch_cpu_offload"]["24"] == 0
    assert "24 GB not even with --cpu-offload" in flux["note"]
    # On 40 GB the weights fit 36 GiB; what is left holds whole pairs only.
    left = 40 * 0.9 * GIB - PARAMS["flux"] * 2
    assert 0 < left and flux["batch"]["40"] == int(left // (flux["activation_mib_per_pair"] * 2**20))
    assert flux["batch"]["80"] > 0 and "80 GB GPUs hold it" in flux["note"]
    assert "--cpu-offload" in printed


def test_doctor_generator_row_measured_where_it_fits(tmp_path, monkeypatch):
    rows, _ = _generator_rows(tmp_path, monkeypatch, 64, "--generators", "sd15", "--resolution", "64")
    row = rows["sd15"]
    assert row["how"].startswith("measured on cpu (fp32, halved) at 64 px")
    assert "activations x64 to 512 px" in row["how"]
    assert row["denoiser_mib_per_pair"] > 0 and row["decode_mib_per_pair"] > 0
    # SD v1.5 in fp16 (2 GiB of weights) fits every GPU listed.
    assert row["batch"]["24"] > 0


def test_doctor_generator_rows_say_tiny_models_are_not_measured(tmp_path, monkeypatch):
    rows, _ = _generator_rows(tmp_path, monkeypatch, 64, "--generators", "sd15", "--models", "tiny")
    assert rows["sd15"]["how"].startswith("meta-device arithmetic (--models tiny;")


def test_doctor_unknown_generator_is_one_line(capsys):
    assert cli_main(["doctor", "--generators", "sd15,dalle"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--generators" in err[0] and "dalle" in err[0] and "flux" in err[0]


def _table(stdout: str) -> list[list[str]]:
    """The production table's rows (cells), from the line after its header on."""
    lines = stdout[stdout.index("production table: ") :].splitlines()
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[3:] if line.startswith("| ")]


def test_gpu_check_cpu_tiny_runs_the_production_table(tmp_path):
    """The production table of benchmarks/gpu_check.py (#43) through the same code on the CPU with
    the tiny models (the production shapes need a GPU): the fp16 sweep's rows, the compiled UNet,
    every generator's denoiser, and the release's GPU-days of both plans, printed first."""
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--cpu-tiny", "--workdir", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA device" in proc.stdout
    assert re.search(r"^production table: device CPU, torch \S+, dtype fp32$", proc.stdout, flags=re.M)
    rows = _table(proc.stdout)
    assert (tmp_path / "production_table.md").read_text().count("\n| ") == len(rows) + 1  # + the rule
    by_stage: dict[str, list[list[str]]] = {}
    for row in rows:
        by_stage.setdefault(row[0], []).append(row)
    sweep = by_stage["SD-1.5 P2P"]
    assert [re.search(r"(\d+) pairs a batch \((\d+) UNet rows\)", r[1]).groups() for r in sweep] == [
        ("1", "4"),
        ("2", "8"),
    ]
    assert all(float(r[2]) > 0 and r[3] == "UNet rows/s" for r in sweep)
    (compiled,) = by_stage["SD-1.5 P2P compiled"]
    assert float(compiled[2]) > 0 and "backend eager" in compiled[1], compiled
    assert re.fullmatch(r"\d+ graph\(s\) compiled under the P2P processors", compiled[6])
    # One candidate pair a step: 2 images x 2 guidance halves, FLUX.1-schnell without guidance.
    found = {
        r[0].split()[1]: re.search(r"(\d+) rows a step", r[1]).group(1) for r in rows if r[0].startswith("denoiser")
    }
    assert found == {"sd15": "4", "sdxl": "4", "sd3": "4", "flux": "2"}, proc.stdout
    assert all(float(r[2]) > 0 for r in rows if r[0].startswith("denoiser"))
    # GPU-days at the fastest SD-1.5 rate: 24,508 caption pairs x rows / rate / 86,400 s, with the
    # paper's 100 candidates x 100 steps x 2 branches x 2 guidance halves = 40,000 rows and the
    # grouped plan's 13,708 (builders/counterfactuals/METHOD.md §2).
    days = by_stage["release GPU-days"]
    assert len(days) == 3
    rate = float(re.search(r"at ([0-9.]+) rows/s", days[0][6]).group(1))
    assert rate == pytest.approx(max(float(r[2]) for r in sweep + [compiled]), abs=0.06)
    assert float(days[0][2]) == pytest.approx(24_508 * 40_000 / rate / 86_400, rel=0.01)
    assert float(days[1][2]) == pytest.approx(24_508 * 13_708 / rate / 86_400, rel=0.01)
    assert "early rejection" in days[2][1] and float(days[2][2]) < float(days[1][2])


def test_gpu_check_skips_a_generator_that_does_not_fit():
    from builders.devtools.generator_rates import generator_rate

    rate = generator_rate("flux", "cpu", memory=GIB)
    assert rate.rows_per_s == 0 and "over 90% of the 1.0 GiB of cpu" in rate.skipped
    # The FLUX.1-schnell transformer alone in fp32 (the CPU's dtype): 11,891,178,560 x 4 bytes.
    needs = float(re.search(r"needs ([0-9.]+) GiB", rate.skipped).group(1))
    assert needs >= 11_891_178_560 * 4 / GIB


def test_live_tensor_bytes_counts_what_is_alive():
    import torch

    from builders.devtools.doctor_generators import LiveTensorBytes

    x = torch.empty(1024, 256, device="meta")  # 1 MiB of fp32, made before: not counted
    with LiveTensorBytes() as live:
        a = x * 2  # +1 MiB
        b = a.view(-1)  # a view of a: +0
        c = (b + 1).half()  # +1 MiB (b + 1), then +0.5 MiB, then the fp32 temporary is freed
        del a, b  # a's storage is freed with its last view: -1 MiB
        d = torch.cat([c, c])  # +1 MiB
        c.mul_(2)  # in place: +0
    assert live.peak == (1 + 1 + 0.5) * 2**20
    assert live.live == (0.5 + 1) * 2**20
    del c, d
