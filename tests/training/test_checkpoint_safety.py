"""`--resume` reads a checkpoint without unpickling anything (#32): a checkpoint holds only files
read as safetensors, JSON or with torch's weights_only loading; a pickle planted in it (a
`__reduce__` payload that would create a marker file) is refused in one line before it is
opened, and never runs; a malformed piece or an incomplete folder is one line; and a run resumed
on 2 processes still continues the loss curve of an uninterrupted run."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from builders.engine.errors import InputFileError
from training.finetune_clip import main as train_main

from helpers.build_helpers import accelerate_cmd
from helpers.training_helpers import REPO_ROOT, SCRIPT, read_jsonl, tiny_args, weights, write_color_set

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


class Payload:
    """Unpickling this creates `marker`: proof that a loader ran code from the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def plant(path: Path, marker: Path) -> None:
    """A pickle as accelerate writes its pieces (torch.save), carrying the payload."""
    torch.save({"lr_lambdas": [None], "state": Payload(marker)}, path)


def assert_payload_is_live(path: Path, marker: Path) -> None:
    """The planted file does run code when unpickled: the test above it could fail."""
    torch.load(path, weights_only=False)
    assert marker.exists()


def args(data: Path, tiny_models_dir: Path, out: Path, *extra: str) -> list[str]:
    flags = ["--real-val-split", "", "--real-test-split", "", "--lr", "1e-3", "--report-to", "none"]
    return tiny_args(data, tiny_models_dir, out, *flags, *extra)


@pytest.fixture(scope="module")
def colors(tmp_path_factory):
    return write_color_set(tmp_path_factory.mktemp("colors") / "colors", {"train": 4})


@pytest.fixture(scope="module")
def run(colors, tiny_models_dir, tmp_path_factory) -> Path:
    """Two steps with a checkpoint after each."""
    out = tmp_path_factory.mktemp("run") / "run"
    assert train_main(args(colors, tiny_models_dir, out, "--max-steps", "2", "--save-every", "1")) == 0
    return out


@pytest.fixture
def copy(run, tmp_path) -> Path:
    """A copy of `run` for one test to tamper with."""
    return Path(shutil.copytree(run, tmp_path / "run"))


def refused(colors, tiny_models_dir, out: Path, capsys, resume_from: str = "latest") -> str:
    """The one error line of a `--resume` that must fail (exit code 2, no traceback)."""
    capsys.readouterr()
    assert train_main(args(colors, tiny_models_dir, out, "--max-steps", "3", "--resume", resume_from)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("counterfactory: error: ")]
    assert len(errors) == 1, err
    return errors[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_checkpoint_holds_only_files_read_without_unpickling(run):
    for step in ("step-00000001", "step-00000002"):
        folder = run / "checkpoints" / step
        assert sorted(p.name for p in folder.iterdir()) == [
            "model.safetensors",
            "optimizer.pt",
            "rng_state_0.json",
            "scheduler.json",
            "trainer_state.json",
        ]
        for name in ("rng_state_0.json", "scheduler.json", "trainer_state.json"):
            json.loads((folder / name).read_text())
        optimizer = torch.load(folder / "optimizer.pt", weights_only=True)
        assert optimizer["state"] and optimizer["param_groups"]
    # The last checkpoint's weights are the final model's (no step after it).
    last, final = weights(run / "checkpoints" / "step-00000002"), weights(run / "final")
    assert last.keys() == {f"model.{k}" for k in final}
    for name, w in final.items():
        np.testing.assert_array_equal(last[f"model.{name}"], w)


@pytest.mark.parametrize("name", ["custom_checkpoint_0.pkl", "random_states_0.pkl", "optimizer.bin"])
def test_a_pickle_planted_in_a_checkpoint_is_refused_before_it_runs(
    colors, tiny_models_dir, copy, tmp_path, capsys, name
):
    """accelerate's checkpoint pieces (its scheduler pickle is unpickled with weights_only=False)
    planted in the newest checkpoint: refused by name, nothing unpickled, nothing lost."""
    marker = tmp_path / "payload-ran"
    planted = copy / "checkpoints" / "step-00000002" / name
    plant(planted, marker)
    before = snapshot(copy)
    err = refused(colors, tiny_models_dir, copy, capsys)
    assert str(planted) in err and "without --resume" in err
    assert not marker.exists()
    assert snapshot(copy) == before  # no checkpoint, log or model touched
    assert_payload_is_live(planted, marker)


def test_a_hostile_optimizer_state_is_refused_by_weights_only_loading(colors, tiny_models_dir, copy, tmp_path, capsys):
    """The one piece read with torch.load (weights_only=True): a payload in it never runs."""
    marker = tmp_path / "payload-ran"
    optimizer = copy / "checkpoints" / "step-00000002" / "optimizer.pt"
    plant(optimizer, marker)
    err = refused(colors, tiny_models_dir, copy, capsys)
    assert str(optimizer) in err and "--resume" in err
    assert not marker.exists()
    assert_payload_is_live(optimizer, marker)


@pytest.mark.parametrize(
    "name, content",
    [
        ("scheduler.json", {"optimizer": None, "last_epoch": 1, "base_lrs": [0.001, 0.001]}),
        ("rng_state_0.json", {"python": [3, [1, 2], None], "numpy": [], "torch": [999]}),
        ("trainer_state.json", {"epoch": 0, "batch": "2", "step": 2, "best_val_loss": None}),
    ],
)
def test_a_tampered_checkpoint_piece_is_one_line(colors, tiny_models_dir, copy, capsys, name, content):
    """JSON cannot run code, but a piece that is not the state it names (a key the scheduler
    does not have would set any attribute of it) is refused, naming the file."""
    piece = copy / "checkpoints" / "step-00000002" / name
    piece.write_text(json.dumps(content))
    err = refused(colors, tiny_models_dir, copy, capsys)
    assert str(piece) in err and "--resume" in err


def test_a_resume_folder_holding_only_trainer_state_is_one_line(colors, tiny_models_dir, run, tmp_path, capsys):
    folder = tmp_path / "elsewhere" / "step-00000002"
    folder.mkdir(parents=True)
    shutil.copy(run / "checkpoints" / "step-00000002" / "trainer_state.json", folder)
    out = tmp_path / "out"
    err = refused(colors, tiny_models_dir, out, capsys, resume_from=str(folder))
    assert str(folder) in err and "model.safetensors" in err and "`latest`" in err
    assert not (out / "checkpoints").exists()


def _edit_state(folder: Path, **changes) -> Path:
    state = folder / "trainer_state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), **changes}))
    return state


def test_a_checkpoint_step_other_than_its_folder_s_is_one_line(colors, tiny_models_dir, copy, capsys):
    """A trainer_state.json at step 10**30 resumed, trained nothing, and appended a final record
    at step 1e30 and rewrote final/ (#41): a checkpoint's step is its folder's name."""
    state = _edit_state(copy / "checkpoints" / "step-00000002", step=10**30)
    before = snapshot(copy)
    err = refused(colors, tiny_models_dir, copy, capsys)
    assert f"{state}: --resume: it records step {10**30}, but its folder is named 'step-00000002'" in err
    assert snapshot(copy) == before


@pytest.mark.parametrize(
    "name, changes, said",
    [
        # Named for its step, past the run's last one (--max-steps 3 here).
        (f"step-{10**30}", {"step": 10**30}, f"at step {10**30}, past this run's last step 3"),
        # Its epoch (2 steps each here) or batch past its step: the loop would not run.
        ("step-00000002", {"epoch": 10**30}, "lie past its step 2"),
        ("step-00000002", {"batch": 10**30}, "lie past its step 2"),
    ],
)
def test_a_checkpoint_position_past_the_run_is_one_line(colors, tiny_models_dir, copy, capsys, name, changes, said):
    folder = copy / "checkpoints" / name
    if name != "step-00000002":
        shutil.copytree(copy / "checkpoints" / "step-00000002", folder)
    state = _edit_state(folder, **changes)
    before = snapshot(copy)
    err = refused(colors, tiny_models_dir, copy, capsys)
    assert err.startswith(f"counterfactory: error: {state}: --resume: ") and said in err, err
    assert snapshot(copy) == before


def test_resuming_past_max_steps_is_one_line_naming_the_flag(colors, tiny_models_dir, copy, capsys):
    """The checkpoint at step 2 resumed with --max-steps 1 trained nothing and wrote a final
    record at step 2 as the run's result."""
    before = snapshot(copy)
    assert train_main(args(colors, tiny_models_dir, copy, "--max-steps", "1", "--resume", "latest")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "give --max-steps and --epochs that reach step 2" in err, err
    assert snapshot(copy) == before


@pytest.mark.accelerate
def test_two_processes_resume_to_the_loss_curve_of_an_uninterrupted_run(colors, tiny_models_dir, tmp_path):
    """2 processes: 2 steps, then `--resume latest` to 4 (every process reads the checkpoint
    and its own RNG state), equal to 4 steps on one process without a stop."""
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    for steps, extra in (("2", ()), ("4", ("--resume", "latest"))):
        cmd = accelerate_cmd(
            SCRIPT,
            *args(
                colors,
                tiny_models_dir,
                resumed,
                "--max-steps",
                steps,
                "--save-every",
                "1",
                "--expect-processes",
                "2",
                *extra,
            ),
        )
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (resumed / "checkpoints" / "step-00000004").iterdir()) == [
        "model.safetensors",
        "optimizer.pt",
        "rng_state_0.json",
        "rng_state_1.json",
        "scheduler.json",
        "trainer_state.json",
    ]
    assert train_main(args(colors, tiny_models_dir, straight, "--max-steps", "4")) == 0
    two, one = read_jsonl(resumed / "loss.jsonl"), read_jsonl(straight / "loss.jsonl")
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2, 3, 4]
    np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], rtol=1e-4, atol=1e-5)
    two_w = weights(resumed / "final")
    for name, w in weights(straight / "final").items():
        # As in test_training: the key bias's gradient is float noise that Adam scales up.
        if not name.endswith("k_proj.bias"):
            np.testing.assert_allclose(two_w[name], w, atol=1e-4, err_msg=name)


def test_the_fp16_grad_scaler_round_trips_through_json(tmp_path):
    """`--mixed-precision fp16` (a GPU only, so not through the CLI here) adds the GradScaler's
    state as scaler.json; a CPU GradScaler has the same state dict. A checkpoint without it is
    incomplete for an fp16 run."""
    from training.checkpoint_files import Resumable, check_files, read_all, write_rng, write_shared

    def pieces(init_scale: float) -> Resumable:
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9**step)
        return Resumable(model, optimizer, scheduler, torch.amp.GradScaler("cpu", init_scale=init_scale))

    saved = pieces(1024.0)
    for _ in range(3):
        saved.scaler.scale(saved.model(torch.randn(4, 3)).sum()).backward()
        saved.scaler.step(saved.optimizer)
        saved.scaler.update()
        saved.optimizer.zero_grad()
        saved.scheduler.step()
    write_shared(tmp_path, saved)
    write_rng(tmp_path, 0)
    resumed = pieces(1.0)
    check_files(tmp_path, fp16=True)
    read_all(tmp_path, resumed, 0)
    assert resumed.scaler.state_dict() == saved.scaler.state_dict()
    assert resumed.scaler.get_scale() == 1024.0
    assert resumed.scheduler.get_last_lr() == saved.scheduler.get_last_lr()
    (tmp_path / "scaler.json").unlink()
    with pytest.raises(InputFileError, match="no scaler.json"):
        check_files(tmp_path, fp16=True)
