"""Issue #49 §1: nothing a build writes or deletes goes through a symlinked folder under --output.

Each case links a folder of a real build to a real second folder holding the user's files, runs
`counterfactory build` again, and checks that the run is refused in one line naming the link and
that the second folder is byte for byte as it was, with no new file in it."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from builders.app.cli import main as cli_main
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture
from builders.engine.sharding.layout import OutputLayout
from builders.engine.sharding.up_to_date import invalidate

from helpers.build_helpers import error_line

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


def build(root: Path, out: Path) -> int:
    argv = ["build", "coco-captions", "--coco-root", str(root), "--splits", "test", "val"]
    return cli_main([*argv, "--output", str(out), "--part-size", "2"])


@pytest.fixture
def coco(tmp_path) -> Path:
    return write_coco_fixture(tmp_path / "coco", CocoFixtureConfig(n_images=6))


@pytest.fixture
def outside(tmp_path) -> Path:
    """The user's own folder, elsewhere on the disk."""
    folder = tmp_path / "outside"
    folder.mkdir()
    return folder


def contents(folder: Path) -> dict[str, bytes]:
    """Every entry under `folder` (links not followed) and its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def link(out: Path, rel: str, target: Path) -> Path:
    """Replace the folder `out/rel` (if any) by a symlink to `target`."""
    path = out / rel
    if path.is_dir():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target, target_is_directory=True)
    return path


def refused(capsys, coco: Path, out: Path, linked: Path, outside: Path) -> None:
    """The build is refused in one line naming the link; `outside` is left as it was."""
    before = contents(outside)
    capsys.readouterr()
    code = build(coco, out)
    assert contents(outside) == before
    assert code == 2
    line = error_line(capsys)
    assert f"{linked} is a symlink" in line and "nothing was written or deleted" in line, line


def test_a_re_merge_through_a_linked_data_folder_is_refused(coco, tmp_path, outside, capsys):
    """Hole: the merge deleted `outside/mine.parquet` (listed with its true sha256 in the
    manifest) while removing stale shards, and wrote the new shards into `outside/`."""
    out = tmp_path / "b"
    assert build(coco, out) == 0
    mine = b"PAR1 the user's own table"
    (outside / "mine.parquet").write_bytes(mine)
    manifest = json.loads((out / "build_manifest.json").read_text())
    manifest["files"].append(
        {"path": "data/mine.parquet", "bytes": len(mine), "sha256": hashlib.sha256(mine).hexdigest()}
    )
    (out / "build_manifest.json").write_text(json.dumps(manifest))
    refused(capsys, coco, out, link(out, "data", outside), outside)
    assert (outside / "mine.parquet").read_bytes() == mine


def test_temp_files_of_a_killed_run_are_never_deleted_through_a_linked_data_folder(coco, tmp_path, outside, capsys):
    """Hole: after a kill (no manifest), `b/data` linked to the user's folder: the re-run's
    clean-up deleted the user's `draft.tmp` and `notes.tmp`."""
    out = tmp_path / "b"
    assert build(coco, out) == 0
    for stats in sorted((out / ".parts/stats").glob("part-*.json"))[1:]:
        stats.unlink()  # killed after its first part
    invalidate(OutputLayout(out))
    (outside / "draft.tmp").write_bytes(b"my draft")
    (outside / "notes.tmp").write_bytes(b"my notes")
    refused(capsys, coco, out, link(out, "data", outside), outside)
    assert sorted(p.name for p in outside.iterdir()) == ["draft.tmp", "notes.tmp"]


@pytest.mark.parametrize("rel", [".parts/stats", ".parts/default/test"])
def test_a_linked_work_folder_is_never_written_through(coco, tmp_path, outside, capsys, rel):
    """Hole: a part or stats file was written into a linked folder below `.parts/` (only the
    last path component was opened without following a link)."""
    out = tmp_path / "b"
    (outside / "keep.json").write_bytes(b"{}")
    refused(capsys, coco, out, link(out, rel, outside), outside)


def test_a_linked_figures_folder_is_neither_emptied_nor_written_through(coco, tmp_path, outside, capsys):
    """Hole: the card's figures were written into a linked `figures/` (its rmtree failed on the
    link, silently), replacing the user's `examples.png`."""
    out = tmp_path / "b"
    assert build(coco, out) == 0
    (outside / "examples.png").write_bytes(b"\x89PNG the user's plot")
    (outside / "keep.png").write_bytes(b"\x89PNG another")
    invalidate(OutputLayout(out))  # the next run merges again, and draws the figures again
    refused(capsys, coco, out, link(out, "figures", outside), outside)
