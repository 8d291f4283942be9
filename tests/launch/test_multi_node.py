"""accelerate's multi-node path on one host: two `accelerate launch --num_machines 2 --machine_rank
0|1 --main_process_ip 127.0.0.1 ...` (one process per "machine", CPU and gloo) sharing the output
folder, as two machines sharing a network filesystem would. A build's shards equal a one-process
build's byte for byte, and a re-run has nothing to do on every machine; a short training run
equals the same two processes launched on one machine. Machines that write to their own disks
fail with one line; parts a network filesystem shows late are waited for.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from builders.devtools.local_hub import free_port
from builders.engine.distributed import ProcessGroup
from builders.engine.errors import UserFacingError
from builders.engine.sharding import runner
from builders.engine.sharding.layout import OutputLayout
from builders.engine.sharding.output_guard import output_lock
from builders.engine.sharding.shares import share_items
from builders.engine.sharding.runner import BuildRunConfig, run_build
from builders.publishing.card import write_card

from helpers import toy_builder
from helpers.build_helpers import ACCELERATE, accelerate_cmd, shard_digests
from helpers.training_helpers import REPO_ROOT, SCRIPT, read_jsonl, weights, write_color_set

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

TOY = Path(__file__).parents[1] / "helpers" / "toy_builder.py"


def two_machines(
    script: Path, *args: str, cwds: tuple[Path, Path] = (REPO_ROOT, REPO_ROOT), check: bool = True
) -> list[subprocess.CompletedProcess]:
    """Run `script ARGS` as machine 0 and machine 1 of a two-machine accelerate job at once, each
    in its working folder of `cwds` (where a relative input path reads that machine's copy)."""
    port = free_port()

    def launch(rank: int) -> list[str]:
        return [
            str(ACCELERATE),
            "launch",
            "--multi_gpu",
            "--num_machines",
            "2",
            "--machine_rank",
            str(rank),
            "--main_process_ip",
            "127.0.0.1",
            "--main_process_port",
            str(port),
            "--num_processes",
            "2",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            str(script),
            *args,
        ]

    procs = [
        subprocess.Popen(launch(rank), cwd=cwds[rank], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in (0, 1)
    ]
    done = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out))
    for proc in done:
        assert proc.returncode == 0 or not check, proc.stdout[-3000:]
    return done


def data_records(out: Path) -> list[dict]:
    manifest = json.loads((out / "build_manifest.json").read_text())
    return [f for f in manifest["files"] if f["path"].startswith("data/")]


@pytest.mark.accelerate
def test_two_machines_build_the_shards_of_one_process(tmp_path):
    single = tmp_path / "single"
    run_build(
        toy_builder.ToyBuilder(toy_builder.ToyConfig(n_items=40)),
        BuildRunConfig(output_dir=single, part_size=4, max_error_fraction=0.2),
        finish=write_card,
    )
    out = tmp_path / "multi"
    machine0, machine1 = two_machines(
        TOY,
        "--output",
        str(out),
        "--n-items",
        "40",
        "--part-size",
        "4",
        "--max-error-fraction",
        "0.2",
        "--expect-processes",
        "2",
    )
    ranks = {json.loads(p.read_text())["rank"] for p in (out / ".parts/stats").glob("*.json")}
    assert ranks == {0, 1}, "each machine must have built its parts"
    assert shard_digests(out) == shard_digests(single)
    assert data_records(out) == data_records(single)  # paths, sizes and sha256 in the manifest
    # Exactly one process (the global main) merges: the second machine's main process does not.
    assert "shard(s)" in machine0.stdout and "shard(s)" not in machine1.stdout
    assert json.loads((out / "build_manifest.json").read_text())["run"]["processes"] == 2

    # Re-run: the main process finds nothing to do and every process follows it (none hangs).
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    machine0, _ = two_machines(
        TOY,
        "--output",
        str(out),
        "--n-items",
        "40",
        "--part-size",
        "4",
        "--max-error-fraction",
        "0.2",
        "--expect-processes",
        "2",
    )
    assert "nothing to do" in machine0.stdout
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.accelerate
def test_two_machines_train_as_two_processes_on_one(tiny_models_dir, tmp_path):
    data = write_color_set(tmp_path / "colors", {"train": 2, "val": 1})
    args = [
        "--real",
        str(data),
        "--real-train-splits",
        "train",
        "--real-test-split",
        "",
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--batch-size",
        "4",
        "--lr",
        "1e-3",
        "--max-steps",
        "3",
        "--save-every",
        "2",
        "--num-workers",
        "0",
        "--expect-processes",
        "2",
    ]
    one = tmp_path / "one_machine"
    proc = subprocess.run(
        accelerate_cmd(SCRIPT, *args, "--output", str(one)), cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = tmp_path / "two_machines"
    two_machines(SCRIPT, *args, "--output", str(two))

    assert json.loads((two / "run.json").read_text())["processes"] == 2
    want, got = read_jsonl(one / "loss.jsonl"), read_jsonl(two / "loss.jsonl")
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3]
    np.testing.assert_allclose([r["loss"] for r in got], [r["loss"] for r in want], atol=1e-6)
    two_w = weights(two / "final")
    for name, w in weights(one / "final").items():
        np.testing.assert_allclose(two_w[name], w, atol=1e-6, err_msg=name)
    assert (two / "checkpoints" / "step-00000002" / "trainer_state.json").is_file()


@pytest.mark.accelerate
def test_machines_with_different_inputs_refuse_in_one_line_each(tmp_path):
    """Silent before: a machine whose copy of the inputs was edited built its parts from it, and
    the merge mixed the two sources. Now every machine learns of it and exits non-zero (the main
    one does not wait forever), before anything is built."""
    machines = (tmp_path / "machine0", tmp_path / "machine1")
    ids = list(range(40))
    for machine in machines:
        machine.mkdir()
        (machine / "items.txt").write_text("\n".join(map(str, ids)))
    # Machine 1's copy: one item changed, in a part machine 1 builds (part 3: items 12-15).
    (machines[1] / "items.txt").write_text("\n".join(map(str, ids[:13] + [113] + ids[14:])))
    out = tmp_path / "shared"
    args = (
        "--output",
        str(out),
        "--items-from",
        "items.txt",
        "--part-size",
        "4",
        "--max-error-fraction",
        "0.2",
        "--expect-processes",
        "2",
    )
    machine0, machine1 = two_machines(TOY, *args, cwds=machines, check=False)
    said = []
    for machine in (machine0, machine1):
        assert machine.returncode != 0, machine.stdout[-3000:]
        lines = [ln for ln in machine.stdout.splitlines() if ln.startswith("counterfactory: error:")]
        assert len(lines) == 1, machine.stdout[-3000:]
        said.append(lines[0])
    assert (
        "this process (rank 1) read 40 items from --items-from items.txt that differ from those rank 0 read" in said[1]
    ), said[1]
    assert "rank(s) 1 read other inputs from --items-from items.txt than rank 0" in said[0], said[0]
    assert not (out / ".parts/run.json").exists() and not (out / ".parts/stats").exists()
    assert not (out / "data").exists()

    # Identical copies (written at other times, so with other mtimes) build as one process does.
    (machines[1] / "items.txt").write_text((machines[0] / "items.txt").read_text())
    two_machines(TOY, *args, cwds=machines)
    single = tmp_path / "single"
    run_build(
        toy_builder.ToyBuilder(toy_builder.ToyConfig(n_items=40)),
        BuildRunConfig(output_dir=single, part_size=4, max_error_fraction=0.2),
        finish=write_card,
    )
    assert shard_digests(out) == shard_digests(single)


@dataclass
class FileItem:
    id: int
    path: Path


def test_the_inputs_digest_ignores_mtimes_but_not_sizes(tmp_path):
    """Identical copies on two machines differ in their files' mtimes only: they agree."""
    items = [FileItem(i, tmp_path / f"{i}.jpg") for i in range(3)]
    for item in items:
        item.path.write_bytes(bytes([item.id]) * 10)

    def digest() -> str | None:
        return share_items(items, 2, lambda k: False, digest=True).digest

    first = digest()
    os.utime(items[1].path, ns=(10**9, 10**9))
    assert digest() == first
    items[2].path.write_bytes(b"longer than before")
    assert digest() != first


def rank0_of_two(out: Path, second_barrier=lambda: None):
    """Rank 0 of a two-process build whose rank 1 ran elsewhere (`second_barrier` plays it)."""
    barriers = iter([lambda: None, second_barrier])
    group = ProcessGroup(rank=0, world_size=2, barrier=lambda: next(barriers)())
    builder = toy_builder.ToyBuilder(toy_builder.ToyConfig(n_items=40))
    cfg = BuildRunConfig(output_dir=out, part_size=4, max_error_fraction=0.2)
    layout = OutputLayout(out)
    with output_lock(layout):
        return runner._run_locked(builder, cfg, group, layout, write_card)


def test_machines_writing_to_their_own_disks_fail_naming_the_shared_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "SHARED_FOLDER_WAIT_S", 0.0)
    out = tmp_path / "machine0"
    with pytest.raises(
        UserFacingError,
        match=r"5 of 10 parts .* \(first: part 1, by rank 1\); "
        r"on several machines --output must be one folder that all of them share",
    ):
        rank0_of_two(out)
    assert not (out / "data").exists()


def test_parts_another_machine_wrote_are_waited_for(tmp_path, monkeypatch):
    """A network filesystem may show the other machine's files a moment after its barrier."""
    monkeypatch.setattr(runner, "SHARED_FOLDER_WAIT_S", 30.0)
    out = tmp_path / "shared"

    def rank1_late() -> None:
        group = ProcessGroup(rank=1, world_size=2, barrier=lambda: None)
        builder = toy_builder.ToyBuilder(toy_builder.ToyConfig(n_items=40))
        share = share_items(builder.work_items(), 4, lambda k: k % 2 == 1)
        threading.Timer(
            1.5, runner._build_mine, (builder, list(builder.outputs()), OutputLayout(out), share, group, False)
        ).start()

    rank0_of_two(out, second_barrier=rank1_late)
    single = tmp_path / "single"
    run_build(
        toy_builder.ToyBuilder(toy_builder.ToyConfig(n_items=40)),
        BuildRunConfig(output_dir=single, part_size=4, max_error_fraction=0.2),
        finish=write_card,
    )
    assert shard_digests(out) == shard_digests(single)


class RecordingState:
    """Stands in for accelerate's state: records that the process group was torn down."""

    def __init__(self) -> None:
        self.destroyed = 0

    def destroy_process_group(self) -> None:
        self.destroyed += 1


@pytest.mark.parametrize("max_error_fraction", [0.2, 0.0], ids=["built", "failed"])
def test_every_run_tears_its_process_group_down(tmp_path, monkeypatch, max_error_fraction):
    """Left to interpreter shutdown, gloo's threads can abort a finished process (SIGABRT)."""
    state = RecordingState()
    monkeypatch.setattr(
        runner,
        "init_process_group",
        lambda expect: ProcessGroup(rank=0, world_size=1, barrier=lambda: None, state=state),
    )
    cfg = BuildRunConfig(output_dir=tmp_path / "out", part_size=4, max_error_fraction=max_error_fraction)
    build = lambda: run_build(toy_builder.ToyBuilder(toy_builder.ToyConfig(n_items=40)), cfg)
    if max_error_fraction == 0.0:  # the toy's items 5, 16, 27 and 38 are input errors
        with pytest.raises(UserFacingError, match="error"):
            build()
        assert state.destroyed == 1
    else:
        build()
        build()  # nothing to do
        assert state.destroyed == 2
