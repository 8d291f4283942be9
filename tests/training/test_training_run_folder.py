"""What a run leaves in its --output folder: one run at a time (the builders' lock),
`--keep-checkpoints N`, `--report-to`, and run.json / the model card naming no local path."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from builders.engine.sharding.layout import OutputLayout
from builders.engine.sharding.output_guard import output_lock
from training.finetune_clip import main as train_main

from helpers.training_helpers import read_jsonl, tiny_args, write_color_set

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


@pytest.fixture(scope="module")
def colors(tmp_path_factory):
    return write_color_set(tmp_path_factory.mktemp("colors") / "colors", {"train": 4, "val": 1, "test": 1})


def test_run_keeps_the_newest_checkpoints_logs_to_tensorboard_and_names_no_local_path(
    colors, tiny_models_dir, tmp_path, capsys
):
    out = tmp_path / "run"
    assert (
        train_main(
            tiny_args(
                colors,
                tiny_models_dir,
                out,
                "--max-steps",
                "5",
                "--save-every",
                "1",
                "--keep-checkpoints",
                "2",
                "--report-to",
                "tensorboard",
            )
        )
        == 0
    )
    # Saved at steps 1..5 (and at the end of no epoch: 160 examples / 16 = 10 steps per epoch).
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000004", "step-00000005"]
    assert [r["step"] for r in read_jsonl(out / "loss.jsonl")] == [1, 2, 3, 4, 5]
    assert list((out / "logs").rglob("events.out.tfevents.*"))
    # Every local path the run was given (data, tiny model, output) is named portably.
    for text in ((out / "run.json").read_text(), (out / "final" / "README.md").read_text()):
        for local in (tmp_path, tiny_models_dir, colors):
            assert str(local) not in text
        assert not re.search(r"(?<![\w.:-])/(tmp|home|work|root|Users)/", text), text[:2000]
    model = json.loads((out / "run.json").read_text())["config"]["run"]["model"]
    assert re.fullmatch(r"local:[\w.-]+@sha256:[0-9a-f]{8,}", model), model
    # A later run resumes where the kept checkpoints end.
    assert (
        train_main(
            tiny_args(
                colors,
                tiny_models_dir,
                out,
                "--max-steps",
                "6",
                "--save-every",
                "1",
                "--keep-checkpoints",
                "2",
                "--resume",
                "latest",
            )
        )
        == 0
    )
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000005", "step-00000006"]
    # A file put into a checkpoint that the rotation would delete (#41): refused in one line
    # naming it, and the folder kept.
    notes = out / "checkpoints" / "step-00000005" / "notes.txt"
    notes.write_text("mine")
    capsys.readouterr()
    resume = tiny_args(
        colors, tiny_models_dir, out, "--max-steps", "7", "--save-every", "1", "--keep-checkpoints", "2"
    )
    assert train_main([*resume, "--resume", "latest"]) == 2
    err = capsys.readouterr().err  # the error follows the progress bar's last `\r` frame
    (line,) = [ln[ln.index("counterfactory: error:") :] for ln in err.splitlines() if "counterfactory: error:" in ln]
    assert str(notes) in line and "nothing was" in line
    assert notes.read_text() == "mine" and (out / "checkpoints" / "step-00000005" / "model.safetensors").is_file()


def test_a_second_run_into_a_locked_output_is_refused_before_writing(colors, tiny_models_dir, tmp_path, capsys):
    out = tmp_path / "run"
    args = tiny_args(colors, tiny_models_dir, out, "--eval-only", "--report-to", "none")
    with output_lock(OutputLayout(out)):  # another run holds the folder
        assert train_main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "use another --output" in err[0] and str(out) in err[0]
        assert not (out / "run.json").exists() and not (out / "logs").exists()
    assert train_main(args) == 0  # released: the same command runs
    assert (out / "run.json").is_file()
    assert not list(out.rglob("events.out.tfevents.*"))  # --report-to none


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_report_to_a_tracker_that_is_not_installed_is_one_line(colors, tiny_models_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_main(tiny_args(colors, tiny_models_dir, out, "--report-to", "wandb")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install wandb" in err[0]
    assert not (out / "run.json").exists()
