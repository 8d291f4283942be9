"""Publishing builds to a (local) Hub with the real clients: versions, tags, resume, secrecy."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from datasets import load_dataset
from huggingface_hub import HfApi

from builders.app.cli import main as cli_main
from builders.engine.errors import PublishError, UserFacingError
from builders.publishing.hub_client import PublishInterrupted
from builders.publishing.publish import PublishConfig, publish
from builders.engine.sharding.runner import BuildRunConfig, run_build
from builders.publishing.card import write_card

from helpers import toy_builder
from helpers.publish_helpers import one_error_line, toy_build

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


def pixels(ds) -> list[np.ndarray]:
    return [np.asarray(img) for img in ds["image"]]


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
            assert all(
                np.array_equal(a, b) for a, b in zip(pixels(remote[split]), pixels(expected[split]), strict=True)
            )
        named = load_dataset(repo_id, "captions", split="train", revision=version)
        assert named["caption"] == load_dataset(str(local), "captions", split="train")["caption"]
    first = next(iter(load_dataset(repo_id, split="train", revision="v1.0.0", streaming=True)))
    assert first["caption"].startswith("v1 ")

    api = HfApi()
    files_v2 = {f.path for f in api.list_repo_tree(repo_id, repo_type="dataset", revision="v1.1.0", recursive=True)}
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


def test_interrupted_publish_resumes_without_recommitting_uploaded_shards(tmp_path, local_hub, repo_id, monkeypatch):
    out = toy_build(tmp_path / "v1", 60, "v1", max_shard_bytes=1_500)
    # Everything but the card and manifest goes in the data commits (shards, the card's figures).
    n_data_files = len(
        [
            p
            for p in out.rglob("*")
            if p.is_file() and ".parts" not in p.parts and p.name not in ("README.md", "build_manifest.json")
        ]
    )
    assert len(list((out / "data").rglob("*.parquet"))) >= 4
    real_commit = HfApi.create_commit
    calls = {"n": 0}

    def flaky_commit(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ConnectionError("network went away")
        return real_commit(self, *args, **kwargs)

    monkeypatch.setattr(HfApi, "create_commit", flaky_commit)
    cfg = PublishConfig(output_dir=out, repo_id=repo_id, version="v1.0.0", max_commit_files=1, retries=1)
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
    assert (
        load_dataset(repo_id, split="train", revision="v1.0.0")["caption"]
        == load_dataset(str(out), split="train")["caption"]
    )


def test_a_transport_error_of_the_http_client_is_retried_and_logged(tmp_path, local_hub, repo_id, monkeypatch, caplog):
    """The Hub client raises `httpx2` errors, which are no built-in `ConnectionError`: without
    them in the back-off, one dropped connection would fail the whole publish."""
    import httpx2

    out = toy_build(tmp_path / "v1", 20, "v1")
    real_commit = HfApi.create_commit
    calls = {"n": 0}

    def dropped_once(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx2.ConnectError("connection reset by peer")
        return real_commit(self, *args, **kwargs)

    monkeypatch.setattr(HfApi, "create_commit", dropped_once)
    with caplog.at_level("WARNING", logger="builders.publishing.hub_client"):
        result = publish(PublishConfig(output_dir=out, repo_id=repo_id, version="v1.0.0", retries=2))
    assert result.commit and calls["n"] >= 2
    assert "failed (connection reset by peer); retrying in 1 s" in caplog.text
    assert (
        load_dataset(repo_id, split="train", revision="v1.0.0")["caption"]
        == load_dataset(str(out), split="train")["caption"]
    )


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


# ------------------------------------------------------------------ failures and recovery (#12)


def tag_target(repo_id: str, version: str, endpoint: str | None = None) -> str | None:
    tags = HfApi(endpoint=endpoint).list_repo_refs(repo_id, repo_type="dataset").tags
    return {t.name: t.target_commit for t in tags}.get(version)


def test_rerun_after_the_tag_was_made_exits_0_when_the_tag_holds_this_build(tmp_path, local_hub, repo_id, capsys):
    out = toy_build(tmp_path / "v1", 20, "v1", max_shard_bytes=2_000)
    assert cli_main(["publish", str(out), "--repo-id", repo_id, "--version", "v1.0.0"]) == 0
    tagged = tag_target(repo_id, "v1.0.0")
    n_commits = len(HfApi().list_repo_commits(repo_id, repo_type="dataset"))
    capsys.readouterr()
    # What a publish killed right after creating the tag leaves behind, re-run as is:
    assert cli_main(["publish", str(out), "--repo-id", repo_id, "--version", "v1.0.0"]) == 0
    assert "already holds exactly this build" in capsys.readouterr().out
    assert tag_target(repo_id, "v1.0.0") == tagged
    assert len(HfApi().list_repo_commits(repo_id, repo_type="dataset")) == n_commits


def test_a_commit_racing_another_publish_is_refused_and_the_tag_holds_one_build(
    tmp_path, local_hub, repo_id, monkeypatch
):
    ours = toy_build(tmp_path / "ours", 20, "ours")
    theirs = toy_build(tmp_path / "theirs", 25, "theirs")
    real_commit = HfApi.create_commit

    def racing_commit(self, *args, **kwargs):
        if "card and manifest" in kwargs["commit_message"]:
            # Another build is published to the same repo just before our final commit.
            monkeypatch.setattr(HfApi, "create_commit", real_commit)
            publish(PublishConfig(output_dir=theirs, repo_id=repo_id, version="v1.0.0"))
        return real_commit(self, *args, **kwargs)

    monkeypatch.setattr(HfApi, "create_commit", racing_commit)
    with pytest.raises(PublishError, match="main branch moved during the publish"):
        publish(PublishConfig(output_dir=ours, repo_id=repo_id, version="v1.0.0", retries=1))
    tagged = load_dataset(repo_id, split="train", revision="v1.0.0")["caption"]
    assert tagged == load_dataset(str(theirs), split="train")["caption"]


def test_tag_made_by_another_publish_in_between_is_detected(tmp_path, local_hub, repo_id, monkeypatch):
    ours = toy_build(tmp_path / "ours", 20, "ours")
    theirs = toy_build(tmp_path / "theirs", 25, "theirs")
    real_tag = HfApi.create_tag

    def racing_tag(self, *args, **kwargs):
        # Between our final commit and our tag, another build is published under the same tag.
        monkeypatch.setattr(HfApi, "create_tag", real_tag)
        publish(PublishConfig(output_dir=theirs, repo_id=repo_id, version="v1.0.0"))
        return real_tag(self, *args, **kwargs)

    monkeypatch.setattr(HfApi, "create_tag", racing_tag)
    with pytest.raises(PublishError, match="does not hold exactly this build"):
        publish(PublishConfig(output_dir=ours, repo_id=repo_id, version="v1.0.0"))
    # The tag is whole: one build's shards and its own card, nothing of ours.
    assert (
        load_dataset(repo_id, split="train", revision="v1.0.0")["caption"]
        == load_dataset(str(theirs), split="train")["caption"]
    )


class _NoRows(toy_builder.ToyBuilder):
    def process(self, items):
        for _ in items:
            yield toy_builder.Skip("nothing_to_keep")


def test_an_empty_build_is_never_published_and_never_loads_its_manifest(tmp_path, local_hub, repo_id, capsys):
    out = tmp_path / "empty"
    run_build(
        _NoRows(toy_builder.ToyConfig(n_items=5)), BuildRunConfig(output_dir=out, part_size=8), finish=write_card
    )
    assert cli_main(["publish", str(out), "--repo-id", repo_id, "--version", "v1.0.0"]) == 2
    assert "has no rows in any output" in one_error_line(capsys)
    assert not HfApi().repo_exists(repo_id, repo_type="dataset")  # refused before any upload
    # Locally too, `configs:` stays explicit: no table appears out of build_manifest.json.
    with pytest.raises(Exception, match="data files"):
        load_dataset(str(out))


@pytest.mark.parametrize(
    "repo, message",
    [
        ("bad id!!", "must be ORG/NAME"),
        ("no-org", "must be ORG/NAME"),
        ("org/bad id!!", "is not a valid Hub repo id"),
        ("org/-dash", "is not a valid Hub repo id"),
        ("org/a--b", "is not a valid Hub repo id"),
    ],
)
def test_invalid_repo_ids_are_one_line(tmp_path, local_hub, repo, message, capsys):
    out = toy_build(tmp_path / "v1", 10, "v1")
    assert cli_main(["publish", str(out), "--repo-id", repo, "--version", "v1.0.0"]) == 2
    assert message in one_error_line(capsys)


def test_no_hub_reachable_is_one_line(tmp_path, own_hub, capsys):
    from builders.devtools.local_hub import free_port

    out = toy_build(tmp_path / "v1", 10, "v1")
    nowhere = f"http://127.0.0.1:{free_port()}"
    assert (
        cli_main(
            [
                "publish",
                str(out),
                "--repo-id",
                "tester/x",
                "--version",
                "v1.0.0",
                "--endpoint",
                nowhere,
                "--retries",
                "2",
            ]
        )
        == 2
    )
    line = one_error_line(capsys)
    assert f"cannot reach the Hub at {nowhere}" in line and "re-run the same command" in line


def test_a_hub_that_stops_answering_times_out_instead_of_hanging(tmp_path, own_hub, capsys):
    out = toy_build(tmp_path / "v1", 10, "v1")
    own_hub.stall()
    assert (
        cli_main(
            [
                "publish",
                str(out),
                "--repo-id",
                "tester/x",
                "--version",
                "v1.0.0",
                "--endpoint",
                own_hub.url,
                "--timeout",
                "0.5",
                "--retries",
                "2",
            ]
        )
        == 2
    )
    line = one_error_line(capsys)
    assert f"the Hub at {own_hub.url} did not answer in time" in line


def test_hub_dying_mid_upload_then_rerun_completes_the_version(tmp_path, own_hub, monkeypatch):
    from builders.devtools.local_hub import LocalHub

    out = toy_build(tmp_path / "v1", 60, "v1", max_shard_bytes=1_500)
    real_commit = HfApi.create_commit
    calls = {"n": 0}

    def dying_commit(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            own_hub.stop()  # the server goes away between two data commits
        return real_commit(self, *args, **kwargs)

    monkeypatch.setattr(HfApi, "create_commit", dying_commit)
    cfg = PublishConfig(
        output_dir=out, repo_id="tester/dying", version="v1.0.0", endpoint=own_hub.url, max_commit_files=1, retries=1
    )
    with pytest.raises(PublishInterrupted, match="cannot reach the Hub"):
        publish(cfg)
    port = int(own_hub.url.rsplit(":", 1)[1])
    with LocalHub(port=port, state=own_hub.state) as restarted:
        result = publish(cfg)
        assert result.unchanged_files == 2  # committed before the server died
        files = {
            f.path
            for f in HfApi(endpoint=restarted.url).list_repo_tree(
                "tester/dying", repo_type="dataset", revision="v1.0.0", recursive=True
            )
            if hasattr(f, "blob_id")
        }
    local = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and ".parts" not in p.parts}
    assert files - {".gitattributes"} == local


def test_endpoint_flag_alone_publishes_and_http_lines_are_quiet(tmp_path, own_hub):
    """`publish --endpoint URL` with nothing else set (no HF_ENDPOINT, no HF_HUB_DISABLE_XET)."""
    import subprocess

    out = toy_build(tmp_path / "v1", 10, "v1")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_ENDPOINT", "HF_HUB_DISABLE_XET")}
    cli = Path(sys.executable).parent / "counterfactory"
    cmd = [
        str(cli),
        "publish",
        str(out),
        "--repo-id",
        "tester/flag-only",
        "--version",
        "v1.0.0",
        "--endpoint",
        own_hub.url,
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "HTTP Request" not in done.stderr
    assert tag_target("tester/flag-only", "v1.0.0", own_hub.url) is not None
    verbose = subprocess.run(
        [
            str(cli),
            "-v",
            *cmd[1:-4],
            "--repo-id",
            "tester/flag-only",
            "--version",
            "v1.0.1",
            "--endpoint",
            own_hub.url,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert "HTTP Request" in verbose.stderr


def test_a_folder_still_being_built_is_not_published(tmp_path, local_hub, repo_id):
    from builders.engine.sharding.layout import OutputLayout
    from builders.engine.sharding.output_guard import output_lock

    out = toy_build(tmp_path / "v1", 10, "v1")
    with output_lock(OutputLayout(out)):  # what a running (resumed) build holds
        with pytest.raises(PublishError, match="a build is still writing to"):
            publish(PublishConfig(output_dir=out, repo_id=repo_id, version="v1.0.0"))
    assert publish(PublishConfig(output_dir=out, repo_id=repo_id, version="v1.0.0")).commit
