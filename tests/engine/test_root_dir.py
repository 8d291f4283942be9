"""`RootDir`: every write, rename and delete below an output root goes through its descriptor, so a
folder below it that is (or becomes) a symlink is refused, and a file outside is never touched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from builders.engine.no_follow import LinkRefused, RootDir


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "mine.txt").write_bytes(b"the user's")
    return folder


def test_every_act_refuses_a_linked_folder_and_leaves_the_outside_file(tmp_path: Path, victim: Path):
    out = tmp_path / "out"
    with RootDir(out, create=True) as root:
        root.write_atomic("data/kept.txt", b"ours")
        os.symlink(victim, out / "data" / "linked")
        acts = [
            lambda: root.write_atomic("data/linked/mine.txt", b"x"),
            lambda: root.open("data/linked/new.txt", "wb"),
            lambda: root.unlink("data/linked/mine.txt"),
            lambda: root.replace("data/kept.txt", "data/linked/mine.txt"),
            lambda: root.remove_tree("data/linked"),
        ]
        for act in acts:
            with pytest.raises(LinkRefused, match="data/linked is a symlink"):
                act()
        # The link is listed, not entered; deleting the tree deletes the link, not its target.
        assert [links for _, _, _, links in root.walk("data")] == [["linked"]]
        root.remove_tree("data")
    assert not (out / "data").exists()
    assert sorted(p.name for p in victim.iterdir()) == ["mine.txt"]
    assert (victim / "mine.txt").read_bytes() == b"the user's"


def test_a_file_that_is_a_link_is_refused_not_written_through(tmp_path: Path, victim: Path):
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim / "mine.txt", out / "run.json")
    with RootDir(out) as root:
        for mode in ("rb", "wb", "ab", "r+b"):
            with pytest.raises(LinkRefused, match="run.json is a symlink"):
                root.open("run.json", mode)
        root.write_atomic("run.json", b"{}")  # replaces the link itself, by rename
    assert not (out / "run.json").is_symlink()
    assert (victim / "mine.txt").read_bytes() == b"the user's"


def test_a_folder_swapped_for_a_link_after_it_was_opened_is_acted_on_where_it_was(tmp_path: Path, victim: Path):
    """The race of a check then an act by path: here the folder is opened (checked), then swapped
    for a link to the user's folder; the act through the descriptor deletes in the real folder."""
    out = tmp_path / "out"
    with RootDir(out, create=True) as root:
        root.write_atomic("data/mine.txt", b"ours")
        with root.parent("data/mine.txt") as (fd, name):
            os.rename(out / "data", out / "moved")
            os.symlink(victim, out / "data")
            os.unlink(name, dir_fd=fd)
        with pytest.raises(LinkRefused):
            root.unlink("data/mine.txt")
    assert not (out / "moved" / "mine.txt").exists()
    assert (victim / "mine.txt").read_bytes() == b"the user's"


def test_paths_leaving_the_root_are_a_bug(tmp_path: Path):
    with RootDir(tmp_path) as root:
        for rel in ("../x", "/etc/passwd", "a/../../x"):
            with pytest.raises(ValueError, match="not a path inside the root"):
                root.unlink(rel)
