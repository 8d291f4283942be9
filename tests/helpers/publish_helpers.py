"""Builds to publish and what a tagged version should hold."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from huggingface_hub import HfApi

from builders.engine.sharding.runner import BuildRunConfig, run_build
from builders.publishing.card import write_card
from helpers import toy_builder


def toy_build(out: Path, n_items: int, tag: str, max_shard_bytes: int = 500_000_000) -> Path:
    builder = toy_builder.ToyBuilder(toy_builder.ToyConfig(n_items=n_items, version_tag=tag))
    run_build(
        builder,
        BuildRunConfig(output_dir=out, part_size=8, max_error_fraction=0.2, max_shard_bytes=max_shard_bytes),
        finish=write_card,
    )
    return out


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("counterfactory: error:")]
    assert len(lines) == 1, err
    return lines[0]


def manifest_of(out: Path) -> dict:
    return json.loads((out / "build_manifest.json").read_text())


def expected_tree(out: Path) -> set[str]:
    """The build's files as the manifest names them, checked against the files themselves."""
    manifest = manifest_of(out)
    listed = {f["path"]: f for f in manifest["files"]}
    shards = {name for o in manifest["outputs"].values() for name in o["shards"]}
    figures = {f["path"] for f in manifest["card_figures"]}
    assert set(listed) == shards | figures and shards and figures
    for path, record in listed.items():
        data = (out / path).read_bytes()
        assert record["bytes"] == len(data) and record["sha256"] == hashlib.sha256(data).hexdigest()
    return set(listed) | {"README.md", "build_manifest.json"}


def tagged_tree(repo: str, version: str, repo_type: str = "dataset", endpoint: str | None = None) -> set[str]:
    entries = HfApi(endpoint=endpoint).list_repo_tree(repo, repo_type=repo_type, revision=version, recursive=True)
    return {e.path for e in entries if hasattr(e, "blob_id")} - {".gitattributes"}
