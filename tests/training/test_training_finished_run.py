"""A finished run is never silently overwritten or continued by another one (#34): a second
command into a non-empty --output is refused in one line, touching nothing, unless --resume
(whose checkpoint must be of the same training configuration) or --overwrite-output-dir (which
deletes the earlier run's files only, and refuses, deleting nothing, a folder holding others)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from training.finetune_clip import main as train_main
from training.sweep import main as sweep_main

from helpers.training_helpers import read_jsonl, write_color_set

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


def args(data: Path, tiny_models_dir: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--real",
        str(data),
        "--real-train-splits",
        "train",
        "--real-val-split",
        "",
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--num-workers",
        "0",
        "--batch-size",
        "16",
        "--lr",
        "1e-6",
        "--output",
        str(out),
        *extra,
    ]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refusal(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    assert train_main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if line.startswith("counterfactory: error: ")]
    return line


@pytest.fixture(scope="module")
def colors(tmp_path_factory):
    return write_color_set(tmp_path_factory.mktemp("colors") / "colors", {"train": 4, "test": 1})


@pytest.fixture(scope="module")
def finished(colors, tiny_models_dir, tmp_path_factory) -> Path:
    """3 steps at lr 1e-6 with a checkpoint after each (the default trackers: TensorBoard)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert train_main(args(colors, tiny_models_dir, out, "--max-steps", "3", "--save-every", "1")) == 0
    return out


def test_a_second_run_into_a_finished_folder_is_refused_touching_nothing(colors, tiny_models_dir, finished, capsys):
    """The issue's case: the same --output with another --lr exited 0 and overwrote final/,
    the metrics, run.json and loss.jsonl, leaving the first run's checkpoints behind."""
    before = snapshot(finished)
    line = refusal(capsys, args(colors, tiny_models_dir, finished, "--lr", "1e-3", "--max-steps", "2"))
    assert f"--output {finished} is not empty" in line and "run.json" in line
    assert "--resume latest" in line and "--overwrite-output-dir" in line
    assert snapshot(finished) == before  # no result, checkpoint or tracker log touched


def test_resuming_a_checkpoint_of_another_configuration_is_refused(colors, tiny_models_dir, finished, capsys):
    """--resume latest took the other run's checkpoint: loss.jsonl logged lr 1e-6 then 1e-3
    while run.json said 1e-3. The checkpoint records the run's training flags."""
    before = snapshot(finished)
    line = refusal(
        capsys,
        args(
            colors, tiny_models_dir, finished, "--lr", "1e-3", "--seed", "4", "--max-steps", "5", "--resume", "latest"
        ),
    )
    state = finished / "checkpoints" / "step-00000003" / "trainer_state.json"
    assert line.startswith(f"counterfactory: error: {state}: --resume: a run of another training configuration")
    assert "--lr 1e-06 there, 0.001 here" in line and "--seed 0 there, 4 here" in line
    assert "--max-steps" not in line  # how far to train is not the configuration
    assert snapshot(finished) == before
    # A checkpoint that records no configuration (an earlier version's) cannot be checked.
    saved = json.loads(state.read_text())
    try:
        state.write_text(json.dumps({k: v for k, v in saved.items() if k != "config"}))
        line = refusal(capsys, args(colors, tiny_models_dir, finished, "--max-steps", "5", "--resume", "latest"))
        assert str(state) in line and "records no training configuration" in line
    finally:
        state.write_text(json.dumps(saved))


def test_a_run_without_checkpoints_is_checked_against_its_run_record(colors, tiny_models_dir, tmp_path, capsys):
    """2 steps, no checkpoint (an epoch is 8): `--resume latest` compares run.json's flags."""
    out = tmp_path / "run"
    assert train_main(args(colors, tiny_models_dir, out, "--max-steps", "2", "--report-to", "none")) == 0
    assert not (out / "checkpoints").exists()
    line = refusal(
        capsys,
        args(
            colors,
            tiny_models_dir,
            out,
            "--max-steps",
            "2",
            "--report-to",
            "none",
            "--hard-negatives",
            "negclip",
            "--resume",
            "latest",
        ),
    )
    assert f"{out / 'run.json'}: --resume: a run of another training configuration" in line
    assert '--hard-negatives "none" there, "negclip" here' in line
    # The same flags: the run is started again (there is no checkpoint to continue from).
    assert (
        train_main(args(colors, tiny_models_dir, out, "--max-steps", "2", "--report-to", "none", "--resume", "latest"))
        == 0
    )


def test_overwrite_output_dir_deletes_only_the_earlier_runs_files(colors, tiny_models_dir, finished, tmp_path, capsys):
    import shutil

    out = Path(shutil.copytree(finished, tmp_path / "run", symlinks=True))
    # A file no run wrote, in the folder, in final/ or beside the trackers' logs (#41): refused,
    # nothing deleted.
    for stray in (out / "notes.txt", out / "final" / "extra.bin", out / "logs" / "my-notes.txt"):
        stray.write_text("mine")
        before = snapshot(out)
        line = refusal(
            capsys, args(colors, tiny_models_dir, out, "--lr", "1e-3", "--max-steps", "1", "--overwrite-output-dir")
        )
        assert "--overwrite-output-dir" in line and str(stray.relative_to(out)) in line
        assert "nothing was deleted" in line
        assert snapshot(out) == before
        stray.unlink()
    # A file the run wrote and the user then edited (#41 §2): refused by --overwrite-output-dir
    # and by --resume (whose finish would replace it), nothing deleted or replaced.
    card = out / "final" / "README.md"
    written = card.read_bytes()
    card.write_bytes(written + b"\nmy notes\n")
    before = snapshot(out)
    line = refusal(capsys, args(colors, tiny_models_dir, out, "--max-steps", "1", "--overwrite-output-dir"))
    assert "final/README.md (changed since it was written)" in line and "nothing was deleted" in line
    line = refusal(capsys, args(colors, tiny_models_dir, out, "--max-steps", "4", "--resume", "latest"))
    assert line.startswith("counterfactory: error: --resume: ") and "README.md (changed since it was written)" in line
    assert snapshot(out) == before
    card.write_bytes(written)
    os.symlink("/etc/hostname", out / "checkpoints" / "link")
    line = refusal(capsys, args(colors, tiny_models_dir, out, "--max-steps", "1", "--overwrite-output-dir"))
    assert "symlink checkpoints/link" in line
    (out / "checkpoints" / "link").unlink()
    line = refusal(
        capsys, args(colors, tiny_models_dir, out, "--max-steps", "1", "--overwrite-output-dir", "--resume", "latest")
    )
    assert "--resume" in line and "--overwrite-output-dir" in line

    # Only the run's files: replaced by the new run's (no checkpoint of the old one is left).
    assert (
        train_main(args(colors, tiny_models_dir, out, "--lr", "1e-3", "--max-steps", "1", "--overwrite-output-dir"))
        == 0
    )
    assert not (out / "checkpoints").exists()
    # The trackers' files: the earlier run's deleted, this run's recorded.
    logs = json.loads((out / "logs_manifest.json").read_text())["files"]
    assert logs and sorted(
        p.relative_to(out / "logs").as_posix() for p in (out / "logs").rglob("*") if p.is_file()
    ) == sorted(r["path"] for r in logs)
    assert [r["lr"] for r in read_jsonl(out / "loss.jsonl")] == [1e-3]
    assert json.loads((out / "run.json").read_text())["config"]["optim"]["lr"] == 1e-3
    assert (out / "final" / "model.safetensors").is_file()


def test_an_interrupted_sweep_seed_continues_and_a_finished_one_is_kept(colors, tiny_models_dir, tmp_path):
    out = tmp_path / "sweep"
    train = args(colors, tiny_models_dir, out)[:-2] + ["--max-steps", "2", "--save-every", "1", "--report-to", "none"]
    assert sweep_main(["--seeds", "1-2", "--output", str(out), "--", *train]) == 0
    finished = snapshot(out / "seed-2")
    # Seed 1 as if killed after its first checkpoint: no results yet.
    seed = out / "seed-1"
    for name in ("final", "final_manifest.json", "metrics.md", "metrics.jsonl", "embeddings.npz"):
        shutil_rm(seed / name)
    record = json.loads((seed / "run.json").read_text())
    del record["final_metrics"]
    (seed / "run.json").write_text(json.dumps(record))
    shutil_rm(seed / "checkpoints" / "step-00000002")
    assert sweep_main(["--seeds", "1-2", "--output", str(out), "--", *train]) == 0
    assert [r["step"] for r in read_jsonl(seed / "loss.jsonl")] == [1, 2]
    assert "final_metrics" in json.loads((seed / "run.json").read_text())
    assert snapshot(out / "seed-2") == finished


def shutil_rm(path: Path) -> None:
    import shutil

    shutil.rmtree(path) if path.is_dir() else path.unlink()
