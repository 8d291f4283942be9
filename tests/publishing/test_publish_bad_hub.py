"""Publishing against a Hub that answers garbage or keeps failing LFS uploads (issue #21).

The local Hub is made to answer one kind of request wrongly (`LocalHub.inject`): a 200 whose body
is broken JSON or JSON of the wrong shape, for the revision info, the tree, the refs, the commit
and the LFS batch, and LFS uploads that fail. After the bounded retries the publish stops with one
line naming the request (method and path, never the token), exit 2; the same command against the
healthy Hub then completes the same version.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from builders.app.cli import main as cli_main
from builders.devtools.local_hub_requests import Fault

from helpers.publish_helpers import expected_tree, one_error_line, tagged_tree, toy_build

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

REPO = "faults/x"
# What each kind of request looks like (the path the line must name), and its fault.
KINDS = {
    "revision": ("GET", rf"/api/datasets/{REPO}/revision/main"),
    "tree": ("GET", rf"/api/datasets/{REPO}/tree/"),
    "refs": ("GET", rf"/api/datasets/{REPO}/refs"),
    "commit": ("POST", rf"/api/datasets/{REPO}/commit/main"),
    "lfs batch": ("POST", rf"/datasets/{REPO}.git/info/lfs/objects/batch"),
}


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    return toy_build(tmp_path_factory.mktemp("bad-hub") / "v1", 30, "v1", max_shard_bytes=3_000)


def publish(build: Path, hub, repo: str) -> int:
    return cli_main(
        ["publish", str(build), "--repo-id", repo, "--version", "v1.0.0", "--endpoint", hub.url, "--retries", "2"]
    )


@pytest.mark.parametrize(
    "body", [b'{"garbage', b"[1]", b"<html>502 Bad Gateway</html>"], ids=["broken-json", "wrong-shape", "html"]
)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_garbage_answer_is_one_line_naming_the_request_and_a_rerun_completes(
    build, own_hub, kind, body, capsys, caplog
):
    method, path = KINDS[kind]
    own_hub.inject(Fault(method, "^" + path.replace(".", r"\."), 200, body))
    with caplog.at_level("WARNING", logger="builders.publishing.hub_client"):
        assert publish(build, own_hub, REPO) == 2
    line = one_error_line(capsys)
    assert f"answered {method} {path}" in line and "not a Hub answer" in line, line
    assert os.environ["HF_TOKEN"] not in line + caplog.text
    assert "retrying in 1 s" in caplog.text  # the bounded retries ran first

    own_hub.clear_faults()
    assert publish(build, own_hub, REPO) == 0
    assert tagged_tree(REPO, "v1.0.0", endpoint=own_hub.url) == expected_tree(build)


@pytest.mark.parametrize("status", [403, 500])
def test_lfs_uploads_that_keep_failing_are_one_line_and_a_rerun_completes(build, own_hub, status, capsys, monkeypatch):
    import time

    monkeypatch.setattr(time, "sleep", lambda s: None)  # the client's and our back-off
    own_hub.inject(Fault("PUT", r"^/_lfs/", status, b'{"error": "SignatureDoesNotMatch"}'))
    assert publish(build, own_hub, REPO) == 2
    line = one_error_line(capsys)
    assert "answered PUT /_lfs/" in line and f"HTTP {status}" in line, line
    assert os.environ["HF_TOKEN"] not in line
    own_hub.clear_faults()
    assert publish(build, own_hub, REPO) == 0
    assert tagged_tree(REPO, "v1.0.0", endpoint=own_hub.url) == expected_tree(build)


def test_publish_metric_against_a_garbage_answer_is_one_line(own_hub, tmp_path, capsys):
    folder = tmp_path / "answer"
    folder.mkdir()
    (folder / "answer.py").write_text("VALUE = 42\n")
    path = "/api/spaces/metrics/answer/commit/main"
    own_hub.inject(Fault("POST", "^" + path, 200, b'{"garbage'))
    cmd = [
        "publish-metric",
        str(folder),
        "--repo-id",
        "metrics/answer",
        "--version",
        "v1.0.0",
        "--endpoint",
        own_hub.url,
    ]
    assert cli_main(cmd) == 2
    line = one_error_line(capsys)
    assert f"answered POST {path} with something that is not a Hub answer" in line, line
    own_hub.clear_faults()
    assert cli_main(cmd) == 0
    assert tagged_tree("metrics/answer", "v1.0.0", "space", own_hub.url) == {"answer.py", "app.py"}
