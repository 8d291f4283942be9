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


#: Reference steps as the model cards and the paper state them (#52; builders/counterfactuals/METHOD.md §2).
REFERENCE_STEPS = {
    "stable-diffusion-v1-5/stable-diffusion-v1-5": 100,
    "stabilityai/stable-diffusion-xl-base-1.0": 50,
    "stabilityai/stable-diffusion-3-medium-diffusers": 28,
    "stabilityai/stable-diffusion-3.5-medium": 40,
    "stabilityai/stable-diffusion-3.5-large": 28,
    "black-forest-labs/FLUX.1-schnell": 4,
    "black-forest-labs/FLUX.1-dev": 28,
}
#: Denoiser rows per candidate pair a step: 2 images x 2 guidance halves (FLUX: no halves).
ROWS_PER_PAIR = {"sd15": 4, "sdxl": 4, "sd3": 4, "flux": 2}


@pytest.fixture(scope="module")
def cpu_tiny(tmp_path_factory) -> tuple[str, Path]:
    """`gpu_check.py --cpu-tiny`'s stdout and workdir, run once for the tests below."""
    tmp_path = tmp_path_factory.mktemp("cpu_tiny")
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
    return proc.stdout, tmp_path


def _stage_costs(rows: list[list[str]], name: str) -> dict:
    """Stage costs of `name` read off its printed rows."""
    mine = [r for r in rows if r[0] == f"stage {name}"]
    one = lambda key: float(next(r[2] for r in mine if key in r[1]))  # noqa: E731
    rates = {
        int(re.search(r"denoiser, (\d+) rows a forward", r[1]).group(1)): float(r[2])
        for r in mine
        if "denoiser," in r[1]
    }
    return {
        "text": one("text encoding"),
        "vae": one("VAE decode"),
        "clip": one("CLIP filters"),
        "injection": one("injection"),
        "rates": rates,
    }


def test_gpu_check_cpu_tiny_prints_the_table_and_the_plan_assumptions(cpu_tiny):
    """The production table of benchmarks/gpu_check.py (#43, #52 item 5) through the same code on
    the CPU with the tiny models: printed first, written to the workdir, with the plan's
    assumptions, the fp16 sweep and the compiled UNet reported apart."""
    stdout, workdir = cpu_tiny
    assert "no CUDA device" in stdout
    assert re.search(r"^production table: device CPU, torch \S+, dtype fp32$", stdout, flags=re.M)
    rows = _table(stdout)
    assert (workdir / "production_table.md").read_text().count("\n| ") == len(rows) + 1  # + the rule
    assumptions = " ".join(r[1] for r in rows if r[0] == "assumption")
    assert "24,508 caption pairs" in assumptions and "whatever their p" in assumptions, assumptions
    sweep = [r for r in rows if r[0] == "SD-1.5 P2P"]
    assert [re.search(r"(\d+) pairs a batch \((\d+) UNet rows\)", r[1]).groups() for r in sweep] == [
        ("1", "4"),
        ("2", "8"),
    ]
    (compiled,) = [r for r in rows if r[0] == "SD-1.5 P2P compiled"]
    assert float(compiled[2]) > 0 and "backend eager" in compiled[1] and "no GPU-days use it" in compiled[6]


def test_gpu_check_cpu_tiny_times_sd15_at_its_reference_steps(cpu_tiny):
    """Every per-pair figure of SD-1.5 (GPU-days, pairs/s) at the paper's 100 steps, not 50."""
    rows = _table(cpu_tiny[0])
    stated = [int(m) for r in rows if "sd15" in r[0] for m in re.findall(r"pairs/s at (\d+) steps", r[6])]
    stated += [int(re.search(r", (\d+) steps,", r[1]).group(1)) for r in rows if r[0] == "GPU-days sd15"]
    assert stated and set(stated) == {100}, stated


def test_gpu_check_cpu_tiny_prints_gpu_days_per_generator(cpu_tiny):
    """GPU-days for every generator and known model at its reference steps and stated batch,
    none from the compiled row, each recomputed from the printed stage costs by the sum written
    out here."""
    from builders.counterfactuals.generators import GENERATORS
    from builders.counterfactuals.model_references import FAMILIES

    rows = _table(cpu_tiny[0])
    days = [r for r in rows if r[3] == "GPU-days"]
    assert not [r for r in days if "compiled" in r[1] + r[6]]
    for name in GENERATORS:
        mine = [r for r in days if r[0] == f"GPU-days {name}"]
        models = [m.hub_id for m in FAMILIES[name].models]
        assert sorted({r[1].split(":")[0] for r in mine}) == sorted(models), (name, mine)
        assert len(mine) == 3 * len(models)
        costs = _stage_costs(rows, name)
        assert costs["rates"] and all(v > 0 for v in costs["rates"].values()), name
        for row in mine:
            _check_day_row(name, row, costs)


def _check_day_row(name: str, row: list[str], costs: dict) -> None:
    model = row[1].split(":")[0]
    steps = int(re.search(r", (\d+) steps, candidate_batch (\d+)", row[1]).group(1))
    if model in REFERENCE_STEPS:
        assert steps == REFERENCE_STEPS[model], row
    note = row[6].replace(",", "")
    n_rows, per_forward = (float(x) for x in re.search(r"([0-9.e+]+) rows \(([0-9.e+]+) a forward", note).groups())
    at, rate = re.search(r"rate at (\d+): ([0-9.e+]+) rows/s", note).groups()
    calls, decodes, pairs = (
        float(re.search(rf"([0-9.e+]+) {w}", note).group(1)) for w in ("calls", "decodes", "CLIP")
    )
    # The rate is the printed denoiser row nearest the plan's rows a forward.
    assert float(rate) == pytest.approx(costs["rates"][int(at)], rel=1e-3)
    assert abs(int(at) - per_forward) == min(abs(k - per_forward) for k in costs["rates"])
    if "paper plan" in row[1]:  # 100 independent candidates, batches of 4, no sharing
        assert (n_rows, calls, decodes, pairs) == (100 * steps * ROWS_PER_PAIR[name], 25, 200, 100), row
        assert per_forward == 4 * ROWS_PER_PAIR[name]
    if name == "sd15" and row[1].endswith("shared, 100 steps, candidate_batch 10"):
        assert n_rows == 13_708  # the grouped 10 x 10 plan's count (builders/counterfactuals/METHOD.md §2)
    seconds = (
        n_rows * costs["injection"] / costs["rates"][int(at)]
        + calls * costs["text"]
        + decodes * costs["vae"]
        + pairs * costs["clip"]
    )
    assert float(row[2]) == pytest.approx(24_508 * seconds / 86_400, rel=0.01), row


def test_gpu_check_skips_a_generator_that_does_not_fit():
    from builders.devtools.generator_rates import fits

    reason = fits("flux", "cpu", "fp32", 1, GIB)
    assert "over 90% of the 1.0 GiB of cpu" in reason
    # The FLUX.1-schnell transformer alone in fp32 (the CPU's dtype): 11,891,178,560 x 4 bytes.
    needs = float(re.search(r"needs ([0-9.]+) GiB", reason).group(1))
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


FAMILY_STAGES = (
    "itm-blip-base",
    "itm-blip-large",
    "itm-bridgetower",
    "itc-bridgetower",
    "itm-vilt",
    "itm-flava",
    "itc-flava",
)


def test_doctor_scores_each_cross_encoder_on_the_tiny_profile(tmp_path, tiny_models_dir, capsys):
    report = _doctor(
        tmp_path, tiny_models_dir, "--models", "tiny", "--stages", ",".join(FAMILY_STAGES), "--generators", "none"
    )
    _check_rows(report, FAMILY_STAGES)
    g = (
        "blip_itm_logit",
        "blip_itm_logit",
        "bridgetower_itm_logit",
        "bridgetower_itc_logit",
        "vilt_itm_logit",
        "flava_itm_logit",
        "flava_itc_logit",
    )
    for row, kind in zip(report["rows"], g, strict=True):
        # Two pairs a row (the caption and its counterfactual), each with its G.
        assert row["items"] == 2 and row["unit"] == "pairs" and row["note"].startswith(kind + " "), row
    printed = capsys.readouterr().out
    assert all(stage in printed for stage in FAMILY_STAGES), printed


def test_doctor_cross_encoders_at_their_published_size(tmp_path, tiny_models_dir):
    from builders.models.production_configs import build_empty, parameter_count
    from builders.models.production_families import FAMILY_ARCH

    stages = "itc-flava,itm-vilt,itm-blip-base"
    report = _doctor(tmp_path, tiny_models_dir, "--stages", stages, "--generators", "none")
    _check_rows(report, ["itm-blip-base", "itm-vilt", "itc-flava"])  # in the doctor's order
    blip, vilt, flava = report["rows"]
    # The weights are the published architecture's (its count: tests/models/test_production_families.py).
    for row, arch in ((vilt, "vilt_coco"), (blip, "blip_itm_base"), (flava, "flava_full_itc")):
        count = parameter_count(build_empty(FAMILY_ARCH[arch]))
        assert row["weights_mib"] == pytest.approx(count * 4 / 2**20, abs=0.1), row
    # At the checkpoints' input sizes: ViLT's 384 px shorter side, BLIP's 384 x 384.
    assert "384x384 px" in vilt["note"] and "384x384 px" in blip["note"] and "224x224 px" in flava["note"]
    assert vilt["batch_fp16"]["24"] > blip["batch_fp16"]["24"] > 0


def test_gpu_check_cpu_tiny_prints_a_row_per_cross_encoder(cpu_tiny):
    """The production table's ITM rows (builders/devtools/family_rates.py, #51): one per family the
    report scores, pairs/s through the report's adapter with the input size and the G it read, in
    the dtype the precision path picks on the device (fp32 on the CPU)."""
    rows = {r[0]: r for r in _table(cpu_tiny[0]) if r[0].startswith("ITM ")}
    families = (
        "BLIP ITM base",
        "BLIP ITM large",
        "BridgeTower large ITM",
        "BridgeTower large ITC",
        "ViLT B/32",
        "FLAVA full (ITM",
        "FLAVA full (contrastive",
    )
    assert len(rows) == len(families) and all(any(f in name for name in rows) for f in families), rows
    kinds = {
        "BLIP": "blip_itm_logit",
        "BridgeTower large ITC": "bridgetower_itc_logit",  # before "Bridge": the first prefix wins
        "Bridge": "bridgetower_itm_logit",
        "ViLT": "vilt_itm_logit",
        "FLAVA full (contrastive)": "flava_itc_logit",  # before "FLAVA"
        "FLAVA": "flava_itm_logit",
    }
    for name, row in rows.items():
        assert row[3] == "pairs/s" and float(row[2]) > 0, row
        assert re.fullmatch(r"fp32, \d+x\d+ px, \d+ tokens, 4 pairs a forward", row[1]), row
        kind = next(k for prefix, k in kinds.items() if name.startswith(f"ITM {prefix}"))
        assert row[6].startswith(f"G {kind}"), row


TRAIN_STAGES = ("train-blip-base", "train-blip-large", "train-bridgetower")
GIB, MIB = 2**30, 2**20


def test_doctor_training_row_per_family_gives_the_recipe_batch_memory(tmp_path, tiny_models_dir, capsys):
    """#53: a training row per family the trainer finetunes, one step of its objective (2 examples),
    with the memory of the recipe's batch (kim2023-blip 16, le2023-bridgetower 128), checked here
    against the arithmetic written out: 16 B/parameter fixed (fp32 weights, gradients, AdamW's two
    moments) + the larger of batch x fp16 activations per example and BridgeTower's
    batch^2 x fp16 no-grad pair."""
    report = _doctor(
        tmp_path, tiny_models_dir, "--models", "tiny", "--stages", ",".join(TRAIN_STAGES), "--generators", "none"
    )
    _check_rows(report, TRAIN_STAGES)
    rows = {r["stage"]: r for r in report["rows"]}
    for stage, batch in zip(TRAIN_STAGES, (16, 16, 128), strict=True):
        row = rows[stage]
        assert row["items"] == 2 and row["unit"] == "examples" and row["recipe_batch"] == batch, row
        assert row["note"].startswith("one step: loss "), row
        params = row["weights_mib"] * MIB / 4
        act = row["activation_mib_per_item"] * MIB / 2
        square = row["square_mib_per_pair"] * MIB / 2
        want = (16 * params + max(batch * act, batch * batch * square)) / GIB
        assert row["recipe_batch_gib"] == pytest.approx(want, rel=0.02, abs=0.01), row
        free = 24 * GIB * 0.9 - 16 * params
        fits = min(free // act, int((free // square) ** 0.5) if square else free // act)
        assert row["batch_fp16"]["24"] == pytest.approx(fits, rel=0.02), row
        assert f"batch {batch}: " in row["note"], row
    bridgetower = rows["train-bridgetower"]
    # Its objective scores the B x B in-batch pairs without gradient: measured, and named in the note.
    assert bridgetower["square_mib_per_pair"] > 0 and "16,384 pairs" in bridgetower["note"], bridgetower
    assert rows["train-blip-base"]["square_mib_per_pair"] == 0
    printed = capsys.readouterr().out
    assert all(f"{stage} " in printed for stage in TRAIN_STAGES), printed
    assert "le2023-bridgetower batch 128: " in printed and "kim2023-blip batch 16: " in printed


def test_doctor_training_row_at_the_published_size(tmp_path, tiny_models_dir):
    from builders.models.production_configs import build_empty, parameter_count
    from builders.models.production_families import FAMILY_ARCH

    report = _doctor(tmp_path, tiny_models_dir, "--stages", "train-blip-base", "--generators", "none")
    _check_rows(report, ["train-blip-base"])
    row = report["rows"][0]
    count = parameter_count(build_empty(FAMILY_ARCH["blip_itm_base"]))
    assert row["weights_mib"] == pytest.approx(count * 4 / MIB, abs=0.1), row
    # The fixed part alone: 16 B/parameter, then the 16 examples' activations on top.
    assert row["recipe_batch_gib"] > 16 * count / GIB and row["recipe_batch"] == 16, row


def test_gpu_check_cpu_tiny_prints_a_training_row_per_family(cpu_tiny):
    """#53: the production table's training rows (builders/devtools/family_rates.py): optimizer
    steps/s of each family's objective, with its recipe's batch named (fp32 on the CPU)."""
    rows = {r[0]: r for r in _table(cpu_tiny[0]) if r[0].startswith("train ")}
    families = ("BLIP ITM base", "BLIP ITM large", "BridgeTower large ITM")
    assert len(rows) == 3 and all(any(name.startswith(f"train {f}") for name in rows) for f in families), rows
    recipes = {"BLIP": "kim2023-blip: 16", "Bridge": "le2023-bridgetower: 128"}
    for name, row in rows.items():
        assert row[3] == "steps/s" and float(row[2]) > 0, row
        recipe = next(r for prefix, r in recipes.items() if name.startswith(f"train {prefix}"))
        assert row[1] == f"fp32, batch 4 ({recipe})", row
        assert "one step: loss " in row[6], row
