"""Publishing builds to a (local) Hub with the real clients: versions, tags, resume, secrecy."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from datasets import load_dataset
from huggingface_hub import HfApi

from builders.infra.cli import main as cli_main
from builders.infra.errors import UserFacingError
from builders.infra.publishing.publish import PublishConfig, publish
from builders.infra.sharding.runner import RunConfig, run_build

sys.path.insert(0, str(Path(__file__).parent))
import toy_builder  # noqa: E402


def toy_build(out: Path, n_items: int, tag: str, max_shard_bytes: int = 500_000_000) -> Path:
    builder = toy_builder.ToyBuilder(toy_builder.ToyConfig(n_items=n_items, version_tag=tag))
    run_build(builder, RunConfig(output_dir=out, part_size=8, max_error_fraction=0.2,
                                 max_shard_bytes=max_shard_bytes))
    return out


def pixels(ds) -> list[np.ndarray]:
    return [np.asarray(img) for img in ds["image"]]


@pytest.fixture
def repo_id(request, local_hub) -> str:
    return f"tester/{request.node.name.replace('_', '-')[:60]}"


def test_publish_two_versions_and_load_each_by_tag(tmp_path, local_hub, repo_id):
    v1 = toy_build(tmp_path / "v1", 40, "v1", max_shard_bytes=2_000)
    v2 = toy_build(tmp_path / "v2", 30, "v2")
    assert cli_main(["publish", str(v1), "--repo-id", repo_id, "--version", "v1.0.0"]) == 0
    publish(PublishConfig(output_dir=v2, repo_id=repo_id, version="v1.1.0"))

    for version, local in (("v1.0.0", v1), ("v1.1.0", v2)):
        remote = load_dataset(repo_id, revision=version)
        expected = load_dataset(str(local))
        for split in ("train", "test"):
            assert remote[split]["caption"] == expected[split]["caption"]
            assert all(np.array_equal(a, b) for a, b in
                       zip(pixels(remote[split]), pixels(expected[split])))
        named = load_dataset(repo_id, "captions", split="train", revision=version)
        assert named["caption"] == load_dataset(str(local), "captions", split="train")["caption"]
    first = next(iter(load_dataset(repo_id, split="train", revision="v1.0.0", streaming=True)))
    assert first["caption"].startswith("v1 ")

    api = HfApi()
    files_v2 = {f.path for f in api.list_repo_tree(repo_id, repo_type="dataset",
                                                     revision="v1.1.0", recursive=True)}
    # v1 had several train shards; v2 has one and the old ones are gone from the new version.
    assert [p for p in files_v2 if p.startswith("data/train-")] == ["data/train-00000-of-00001.parquet"]
    card = Path(api.hf_hub_download(repo_id, "README.md", repo_type="dataset", revision="v1.1.0"))
    text = card.read_text()
    assert "v1.1.0" in text and f'load_dataset("{repo_id}"' in text and "config_name: captions" in text


def test_existing_tag_is_never_moved(tmp_path, local_hub, repo_id, capsys):
    out = toy_build(tmp_path / "v1", 20, "v1")
    publish(PublishConfig(output_dir=out, repo_id=repo_id, version="v1.0.0"))
    tagged = {t.name: t.target_commit for t in HfApi().list_repo_refs(repo_id, repo_type="dataset").tags}
    other = toy_build(tmp_path / "other", 25, "other")
    with pytest.raises(UserFacingError, match="already has tag v1.0.0"):
        publish(PublishConfig(output_dir=other, repo_id=repo_id, version="v1.0.0"))
    assert cli_main(["publish", str(other), "--repo-id", repo_id, "--version", "v1.0.0"]) == 2
    assert "tags are never moved" in capsys.readouterr().err
    after = {t.name: t.target_commit for t in HfApi().list_repo_refs(repo_id, repo_type="dataset").tags}
    assert after == tagged
    assert load_dataset(repo_id, split="train", revision="v1.0.0")["caption"][0].startswith("v1 ")


def test_interrupted_publish_resumes_without_recommitting_uploaded_shards(
        tmp_path, local_hub, repo_id, monkeypatch):
    out = toy_build(tmp_path / "v1", 60, "v1", max_shard_bytes=1_500)
    n_data_files = len(list((out / "data").rglob("*.parquet")))
    assert n_data_files >= 4
    real_commit = HfApi.create_commit
    calls = {"n": 0}

    def flaky_commit(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ConnectionError("network went away")
        return real_commit(self, *args, **kwargs)

    monkeypatch.setattr(HfApi, "create_commit", flaky_commit)
    cfg = PublishConfig(output_dir=out, repo_id=repo_id, version="v1.0.0",
                        max_commit_files=1, retries=1)
    with pytest.raises(ConnectionError):
        publish(cfg)
    monkeypatch.setattr(HfApi, "create_commit", real_commit)
    result = publish(cfg)
    # Two data files were committed before the failure; only the rest are uploaded again.
    assert result.unchanged_files == 2
    assert result.uploaded_files == n_data_files - 2
    commits = HfApi().list_repo_commits(repo_id, repo_type="dataset")
    data_commits = [c for c in commits if ": data " in c.title]
    assert len(data_commits) == n_data_files
    assert load_dataset(repo_id, split="train", revision="v1.0.0")["caption"] == \
        load_dataset(str(out), split="train")["caption"]


def test_token_is_never_written(tmp_path, local_hub, repo_id, caplog, capsys):
    import os

    token = os.environ["HF_TOKEN"]
    out = toy_build(tmp_path / "v1", 20, "v1")
    with caplog.at_level("DEBUG"):
        assert cli_main(["publish", str(out), "--repo-id", repo_id, "--version", "v1.0.0"]) == 0
    captured = capsys.readouterr()
    assert token not in caplog.text + captured.out + captured.err
    for path in out.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path
    card = HfApi().hf_hub_download(repo_id, "README.md", repo_type="dataset", revision="v1.0.0")
    assert token not in Path(card).read_text()


def test_bad_version_and_unfinished_build_are_clear_errors(tmp_path, local_hub):
    out = toy_build(tmp_path / "v1", 10, "v1")
    with pytest.raises(UserFacingError, match="must look like v1.2.3"):
        publish(PublishConfig(output_dir=out, repo_id="tester/x", version="1.0"))
    with pytest.raises(UserFacingError, match="not a finished counterfactory build"):
        publish(PublishConfig(output_dir=tmp_path, repo_id="tester/x", version="v1.0.0"))


def test_published_columns_keep_the_build_order(tmp_path, local_hub, repo_id):
    out = toy_build(tmp_path / "v1", 12, "v1")
    publish(PublishConfig(output_dir=out, repo_id=repo_id, version="v1.0.0"))
    remote = load_dataset(repo_id, split="train", revision="v1.0.0")
    assert remote.column_names == list(toy_builder.MAIN) == load_dataset(str(out), split="train").column_names
