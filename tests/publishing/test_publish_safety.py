"""Publishing sends only the build's own files (issue #21).

A build folder holding a symlink (to a secret or not), a dotfile or a stray file is refused with
one line naming them before any request reaches the Hub; once they are gone, the tagged tree is
exactly the manifest's file list plus the card and the manifest. `--overwrite` deletes the old
build and no file of the user's; versions are validated as whole ASCII strings.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from huggingface_hub import HfApi

from builders.app.cli import main as cli_main
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture

from helpers.publish_helpers import expected_tree, manifest_of, one_error_line, tagged_tree, toy_build

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

SECRET = "TOP-SECRET-VALUE"


def publish_cli(out: Path, repo: str, version: str = "v1.0.0") -> int:
    return cli_main(["publish", str(out), "--repo-id", repo, "--version", version, "--retries", "1"])


def test_symlinks_dotfiles_and_stray_files_are_refused_and_nothing_is_uploaded(tmp_path, local_hub, repo_id, capsys):
    out = toy_build(tmp_path / "v1", 30, "v1", max_shard_bytes=2_000)
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "more.parquet").write_text(SECRET)
    (out / "notes-link.txt").symlink_to(secret)
    (out / "data" / "linked").symlink_to(elsewhere)
    (out / ".env").write_text(f"HF_TOKEN={SECRET}\n")
    (out / "notes.txt").write_text("my notes\n")
    (out / "figures" / "draft.png").write_bytes(b"not a figure of the build")

    assert publish_cli(out, repo_id) == 2
    line = one_error_line(capsys)
    for name in ("symlink notes-link.txt", "symlink data/linked", ".env", "notes.txt", "figures/draft.png"):
        assert name in line
    assert SECRET not in line
    assert not HfApi().repo_exists(repo_id, repo_type="dataset")  # refused before any upload

    for path in ("notes-link.txt", "data/linked", ".env", "notes.txt", "figures/draft.png"):
        (out / path).unlink()
    assert publish_cli(out, repo_id) == 0
    assert tagged_tree(repo_id, "v1.0.0") == expected_tree(out)


def _append_to_a_shard(out: Path, tmp_path: Path) -> str:
    shard = sorted((out / "data").glob("train-*.parquet"))[0]
    with open(shard, "ab") as fh:
        fh.write(b"appended")
    return f"{shard} changed since the build"


def _shard_replaced_by_a_symlink(out: Path, tmp_path: Path) -> str:
    shard = sorted((out / "data").glob("train-*.parquet"))[0]
    copy = tmp_path / "copy.parquet"
    shutil.copy(shard, copy)  # the same bytes: only the link gives it away
    shard.unlink()
    shard.symlink_to(copy)
    return f"symlink {shard.relative_to(out).as_posix()}"


def _manifest_lists_a_path_outside(out: Path, tmp_path: Path) -> str:
    (tmp_path / "secret.txt").write_text(SECRET)
    data = SECRET.encode()
    manifest = manifest_of(out)
    manifest["files"].append({"path": "../secret.txt", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    (out / "build_manifest.json").write_text(json.dumps(manifest))
    return "lists '../secret.txt' as a file of the build"


def _a_listed_figure_is_missing(out: Path, tmp_path: Path) -> str:
    (out / "figures" / "examples.png").unlink()
    return "figures/examples.png is listed in build_manifest.json but is missing"


def _manifest_from_before_file_lists(out: Path, tmp_path: Path) -> str:
    manifest = manifest_of(out)
    del manifest["files"]
    (out / "build_manifest.json").write_text(json.dumps(manifest))
    return "lists no files"


@pytest.mark.parametrize(
    "tamper",
    [
        _append_to_a_shard,
        _shard_replaced_by_a_symlink,
        _manifest_lists_a_path_outside,
        _a_listed_figure_is_missing,
        _manifest_from_before_file_lists,
    ],
    ids=["changed", "symlinked", "outside", "missing", "unlisted"],
)
def test_a_tampered_build_is_refused(tmp_path, local_hub, repo_id, tamper, capsys):
    """A listed file that changed, became a symlink, lies outside the folder or is gone."""
    out = toy_build(tmp_path / "v1", 30, "v1", max_shard_bytes=2_000)
    message = tamper(out, tmp_path)
    assert publish_cli(out, repo_id) == 2
    line = one_error_line(capsys)
    assert message in line and SECRET not in line
    assert not HfApi().repo_exists(repo_id, repo_type="dataset")


def test_a_new_version_removes_every_file_its_manifest_does_not_list(tmp_path, local_hub, repo_id):
    v1 = toy_build(tmp_path / "v1", 40, "v1", max_shard_bytes=1_500)
    v2 = toy_build(tmp_path / "v2", 30, "v2")
    assert publish_cli(v1, repo_id, "v1.0.0") == 0
    assert publish_cli(v2, repo_id, "v1.1.0") == 0
    assert tagged_tree(repo_id, "v1.0.0") == expected_tree(v1)
    assert tagged_tree(repo_id, "v1.1.0") == expected_tree(v2)
    assert expected_tree(v1) - expected_tree(v2)  # v1 had shards v2 does not


def coco_build(coco: Path, out: Path, *extra: str) -> int:
    return cli_main(
        ["build", "coco-captions", "--coco-root", str(coco), "--output", str(out), "--part-size", "2", *extra]
    )


def test_overwrite_deletes_the_old_build_but_never_a_file_of_the_users(tmp_path, capsys):
    coco = write_coco_fixture(tmp_path / "coco", CocoFixtureConfig(n_images=8))
    out = tmp_path / "out"
    assert coco_build(coco, out, "--splits", "test", "val") == 0
    old = expected_tree(out)
    assert any(p.startswith("data/val-") for p in old)
    old_manifest = (out / "build_manifest.json").read_bytes()
    (out / ".env").write_text(f"HF_TOKEN={SECRET}\n")
    (out / "data" / "mine.csv").write_text("a,b\n")
    (out / "link").symlink_to(tmp_path / "coco")
    capsys.readouterr()

    assert coco_build(coco, out, "--splits", "test", "--overwrite") == 2
    line = one_error_line(capsys)
    assert all(name in line for name in (".env", "data/mine.csv", "symlink link"))
    assert "nothing was deleted" in line
    assert (out / "build_manifest.json").read_bytes() == old_manifest
    assert all((out / p).is_file() for p in old | {".env", "data/mine.csv"})

    for path in (".env", "data/mine.csv", "link"):
        (out / path).unlink()
    assert coco_build(coco, out, "--splits", "test", "--overwrite") == 0
    new = expected_tree(out)
    assert not any(p.startswith("data/val-") for p in new)
    left = {
        p.relative_to(out).as_posix()
        for p in out.rglob("*")
        if not p.is_dir() and ".parts" not in p.relative_to(out).parts
    }
    assert left == new


BAD_VERSIONS = ["v1.0.0\n", "v1.0.0 ", " v1.0.0", "v\uff11.0.0", "v\u0661.\u0660.\u0660", "v1.0", "1.0.0"]


@pytest.fixture(scope="module")
def small_build(tmp_path_factory) -> Path:
    return toy_build(tmp_path_factory.mktemp("small") / "b", 10, "v1")


@pytest.mark.parametrize("version", BAD_VERSIONS)
def test_a_version_is_validated_as_a_whole_ascii_string(small_build, local_hub, version, capsys):
    assert cli_main(["publish", str(small_build), "--repo-id", "tester/versions", "--version", version]) == 2
    assert "must look like v1.2.3" in one_error_line(capsys)
    module = Path(__file__).resolve().parents[2] / "evaluate_modules" / "map_at_r"
    assert cli_main(["publish-metric", str(module), "--repo-id", "tester/versions-metric", "--version", version]) == 2
    assert "must look like v1.2.3" in one_error_line(capsys)
    assert not HfApi().repo_exists("tester/versions", repo_type="dataset")
    assert not HfApi().repo_exists("tester/versions-metric", repo_type="space")


def test_a_metric_space_holds_exactly_its_module_files(tmp_path, local_hub):
    folder = tmp_path / "answer"
    folder.mkdir()
    (folder / "answer.py").write_text("from .shared import VALUE\n")
    (folder / "shared.py").write_text("VALUE = 42\n")
    (folder / "README.md").write_text("---\nsdk: gradio\nsdk_version: 3.50.2\napp_file: app.py\n---\ncard\n")
    (folder / "requirements.txt").write_text("numpy\n")
    (folder / ".env").write_text(f"HF_TOKEN={SECRET}\n")
    (folder / "notes.txt").write_text("notes\n")
    (folder / "unused.py").write_text("X = 1\n")
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "answer.cpython-311.pyc").write_bytes(b"\0")
    assert cli_main(["publish-metric", str(folder), "--repo-id", "own-files/answer", "--version", "v1.0.0"]) == 0
    assert tagged_tree("own-files/answer", "v1.0.0", "space") == {
        "answer.py",
        "shared.py",
        "README.md",
        "requirements.txt",
        "app.py",
    }
