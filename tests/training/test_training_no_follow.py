"""The trainer never writes or deletes through a symlinked folder or file (#49), through its command
line: every write, rename and delete below the run folder (`--output`) is relative to its
descriptor (training/run_root.py), and a run folder holding a link is refused in one line naming
it, before anything is written or deleted.

Each case uses a real symlink to a real second folder (or file) beside the run, and checks that
what lies there is byte for byte unchanged, and (where the refusal comes first) that the run
folder is too. The races swap a folder (or a final file, for `--push-to-hub`) for a link between
the check and the act with a hook on the check: with descriptor-relative acts no timing is
involved.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import training.checkpoint
import training.final_files
import training.run_folder
from training.finetune_clip import main as train_main

from helpers.training_helpers import tiny_args, write_color_set

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

VICTIM = b"the user's own file, outside the run folder\n"


def args(data: Path, tiny_models_dir: Path, out: Path, *extra: str) -> list[str]:
    """A run that writes every file a run can: evaluations, the best model, checkpoints, logs."""
    flags = ["--lr", "1e-3", "--eval-every", "1", "--best-by-val-loss", "--save-every", "1"]
    return tiny_args(data, tiny_models_dir, out, *flags, "--report-to", "tensorboard", *extra)


def tree(folder: Path) -> dict[str, object]:
    """Every entry below `folder`, never following a link: a file's bytes, a link's target."""
    found: dict[str, object] = {}
    for here, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(here) / name
            rel = path.relative_to(folder).as_posix()
            found[rel] = (
                ("link", os.readlink(path)) if path.is_symlink() else path.read_bytes() if name in files else "dir"
            )
    return found


def train(capsys, argv: list[str]) -> tuple[int, str]:
    """The run's exit status and standard error."""
    capsys.readouterr()
    status = train_main(argv)
    return status, capsys.readouterr().err


def refusal(status: int, err: str) -> str:
    """The one error line of a refused run (no traceback)."""
    assert status == 2
    assert "Traceback" not in err, err
    (line,) = [ln[ln.index("counterfactory: error:") :] for ln in err.splitlines() if "counterfactory: error:" in ln]
    return line


@pytest.fixture(scope="module")
def colors(tmp_path_factory):
    return write_color_set(tmp_path_factory.mktemp("colors") / "colors", {"train": 4, "val": 1, "test": 1})


@pytest.fixture(scope="module")
def finished(colors, tiny_models_dir, tmp_path_factory) -> Path:
    """2 steps, a checkpoint and an evaluation after each: run.json, loss.jsonl, metrics.*,
    checkpoints/step-1 and -2, best/, final/, logs/."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert train_main(args(colors, tiny_models_dir, out, "--max-steps", "2")) == 0
    for name in ("best", "final", "logs", "checkpoints/step-00000002", "metrics.md", "run.json"):
        assert (out / name).exists(), name
    return out


@pytest.fixture
def run(finished, tmp_path) -> Path:
    """A copy of the finished run, with the user's file `victim.txt` beside it."""
    (tmp_path / "victim.txt").write_bytes(VICTIM)
    return Path(shutil.copytree(finished, tmp_path / "run", symlinks=True))


@pytest.mark.parametrize("name", ["metrics.md", "run.json", "loss.tmp", "loss.jsonl.tmp"])
def test_resume_refuses_a_record_linked_outside_and_writes_nothing(colors, tiny_models_dir, run, capsys, name):
    link = run / name
    link.unlink(missing_ok=True)
    link.symlink_to("../victim.txt")
    before = tree(run)
    done = train(capsys, args(colors, tiny_models_dir, run, "--max-steps", "3", "--resume", "latest"))
    assert (run.parent / "victim.txt").read_bytes() == VICTIM
    assert tree(run) == before
    line = refusal(*done)
    assert f"symlink {name}" in line and str(run) in line and "nothing was written" in line


def test_rotation_never_deletes_through_a_linked_checkpoints_folder(colors, tiny_models_dir, run, capsys):
    # Another run's checkpoints, in a real folder of the user's; the run's `checkpoints` links there.
    other = run.parent / "other-run-checkpoints"
    shutil.move(run / "checkpoints", other)
    (run / "checkpoints").symlink_to(other)
    outside, before = tree(other), tree(run)
    assert {"step-00000001", "step-00000002"} <= set(outside)
    done = train(
        capsys,
        args(colors, tiny_models_dir, run, "--max-steps", "3", "--keep-checkpoints", "1", "--resume", "latest"),
    )
    assert tree(other) == outside and tree(run) == before
    line = refusal(*done)
    assert "symlink checkpoints" in line and "nothing was written or deleted" in line


@pytest.mark.parametrize("name", ["final", "logs", "best"])
def test_resume_refuses_a_linked_final_logs_or_best_folder(colors, tiny_models_dir, run, capsys, name):
    other = run.parent / f"users-{name}"
    shutil.move(run / name, other)
    (run / name).symlink_to(other)
    outside, before = tree(other), tree(run)
    done = train(capsys, args(colors, tiny_models_dir, run, "--max-steps", "3", "--resume", "latest"))
    assert tree(other) == outside and tree(run) == before
    line = refusal(*done)
    assert f"symlink {name}" in line and "nothing was written" in line


def test_a_new_run_refuses_a_linked_logs_folder(colors, tiny_models_dir, tmp_path, capsys):
    # `logs/` is what a refused run leaves, so a new run may start beside it; never through a link.
    other = tmp_path / "users-logs"
    other.mkdir()
    (other / "notes.txt").write_bytes(VICTIM)
    out = tmp_path / "run"
    out.mkdir()
    (out / "logs").symlink_to(other)
    done = train(capsys, args(colors, tiny_models_dir, out, "--max-steps", "1"))
    assert tree(other) == {"notes.txt": VICTIM} and tree(out) == {"logs": ("link", str(other))}
    assert "symlink logs" in refusal(*done)


def _swap_for_link(run: Path, rel: str, outside: Path) -> None:
    """Move the run's folder `rel` aside and put a link to `outside` (a copy of it) in its place."""
    shutil.move(run / rel, run.parent / "moved-aside")
    (run / rel).symlink_to(outside)


def test_overwrite_clearing_deletes_nothing_through_a_folder_swapped_after_the_check(
    colors, tiny_models_dir, run, capsys, monkeypatch
):
    # The user's folder holds files of the same names as the run's checkpoints.
    outside = Path(shutil.copytree(run / "checkpoints", run.parent / "users-folder"))
    kept = tree(outside)
    checked = training.run_folder.run_files
    calls = []

    def check_then_swap(*a, **kw):
        files = checked(*a, **kw)
        calls.append(1)
        if len(calls) == 2:  # the main process's check in clear_run_folder, right before it deletes
            _swap_for_link(run, "checkpoints", outside)
        return files

    monkeypatch.setattr(training.run_folder, "run_files", check_then_swap)
    done = train(capsys, args(colors, tiny_models_dir, run, "--max-steps", "1", "--overwrite-output-dir"))
    assert len(calls) == 2 and tree(outside) == kept
    assert f"{run / 'checkpoints'} is a symlink" in refusal(*done)


def test_rotation_deletes_nothing_through_a_folder_swapped_after_the_check(
    colors, tiny_models_dir, tmp_path, capsys, monkeypatch
):
    out, outside = tmp_path / "run", tmp_path / "users-folder"
    (outside / "step-00000001").mkdir(parents=True)
    (outside / "step-00000001" / "model.safetensors").write_bytes(VICTIM)
    checked = training.checkpoint._check_checkpoint
    swapped = []

    def check_then_swap(root, rel):
        checked(root, rel)
        if rel == "checkpoints/step-00000001" and (out / rel).is_dir() and not swapped:  # rotation
            swapped.append(rel)
            _swap_for_link(out, "checkpoints", outside)

    monkeypatch.setattr(training.checkpoint, "_check_checkpoint", check_then_swap)
    done = train(capsys, args(colors, tiny_models_dir, out, "--max-steps", "2", "--keep-checkpoints", "1"))
    assert swapped and tree(outside) == {"step-00000001": "dir", "step-00000001/model.safetensors": VICTIM}
    assert f"{out / 'checkpoints'} is a symlink" in refusal(*done)


def test_the_push_sends_no_file_swapped_for_a_link_after_the_check(
    colors, tiny_models_dir, tmp_path, capsys, monkeypatch, local_hub, repo_id
):
    from huggingface_hub import HfApi

    out, secret = tmp_path / "run", tmp_path / "secret.txt"
    secret.write_bytes(VICTIM)
    checked = training.final_files.published_files

    def check_then_swap(final, manifest):
        files = checked(final, manifest)
        (final / "config.json").unlink()
        (final / "config.json").symlink_to(secret)
        return files

    monkeypatch.setattr(training.final_files, "published_files", check_then_swap)
    monkeypatch.setattr(training.checkpoint, "published_files", check_then_swap, raising=False)  # (before #49)
    done = train(capsys, args(colors, tiny_models_dir, out, "--max-steps", "1", "--push-to-hub", repo_id))
    assert not HfApi().repo_exists(repo_id, repo_type="model")  # nothing sent, the secret least of all
    assert f"{out / 'final' / 'config.json'} is a symlink" in refusal(*done)
    assert secret.read_bytes() == VICTIM


@pytest.mark.parametrize("name", ["summary.md", "seed-1"])
def test_a_sweep_refuses_a_link_in_its_output_before_any_seed_runs(colors, tiny_models_dir, tmp_path, capsys, name):
    from training.sweep import main as sweep_main

    out, users = tmp_path / "sweep", tmp_path / "users"
    users.mkdir()
    (users / "notes.txt").write_bytes(VICTIM)
    out.mkdir()
    (out / name).symlink_to(users / "notes.txt" if name == "summary.md" else users)
    given = args(colors, tiny_models_dir, out, "--max-steps", "1", "--report-to", "none")
    train = given[: given.index("--output")] + given[given.index("--output") + 2 :]  # the sweep's own
    capsys.readouterr()
    status = sweep_main(["--seeds", "1", "--output", str(out), "--", *train])
    err = capsys.readouterr().err
    assert tree(users) == {"notes.txt": VICTIM} and sorted(tree(out)) == [name]
    assert f"symlink {name}" in refusal(status, err)


@pytest.mark.parametrize(("name", "ours"), [(".tmpBfgaU4", True), ("notes.txt", False)])
def test_a_save_killed_midway_is_redone_and_a_users_file_is_refused(colors, tiny_models_dir, run, capsys, name, ours):
    """A run killed while safetensors wrote step 3's model leaves its temporary sibling (Rust's
    `tempfile`: ".tmp" and 6 characters) in an incomplete checkpoint: resuming deletes it as the
    trainer's own and saves step 3 again; a file the user put there is refused in one line."""
    step = run / "checkpoints" / "step-00000003"
    step.mkdir()
    (step / name).write_bytes(b"half a model")
    status, err = train(capsys, args(colors, tiny_models_dir, run, "--max-steps", "3", "--resume", "latest"))
    if ours:
        assert status == 0, err
        assert not (step / name).exists() and (step / "trainer_state.json").is_file()
    else:
        line = refusal(status, err)
        assert name in line and "move it out" in line and (step / name).read_bytes() == b"half a model"
