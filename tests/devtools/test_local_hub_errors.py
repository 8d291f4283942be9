"""The local Hub answers malformed requests with 400 and `{"error": ...}`, as the real Hub does,
instead of dropping the connection; and it refuses the repo ids and file paths the Hub refuses
(issue #21). Raw HTTP, so that nothing in a client can tidy the request up first."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
from urllib.parse import urlparse

import pytest

from builders.devtools.local_hub import LocalHub

REPO = "tester/raw"


@pytest.fixture(scope="module")
def hub():
    hub = LocalHub().start()
    status, _ = send(hub, "POST", "/api/repos/create", json.dumps({"name": "raw", "type": "dataset"}).encode())
    assert status == 200
    yield hub
    hub.stop()


def connect(hub) -> http.client.HTTPConnection:
    url = urlparse(hub.url)
    return http.client.HTTPConnection(url.hostname, url.port, timeout=10)


def send(
    hub,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict | None = None,
    conn: http.client.HTTPConnection | None = None,
) -> tuple[int, dict | list | None]:
    conn = conn or connect(hub)
    conn.request(method, path, body=body, headers={"Authorization": "Bearer hf_x", **(headers or {})})
    response = conn.getresponse()
    data = response.read()
    return response.status, json.loads(data) if data else None


def ndjson(*lines: dict) -> bytes:
    return b"\n".join(json.dumps(line).encode() for line in lines)


HEADER = {"key": "header", "value": {"summary": "s", "description": ""}}


def file_op(path: str, content: bytes = b"x") -> dict:
    return {
        "key": "file",
        "value": {"path": path, "content": base64.b64encode(content).decode(), "encoding": "base64"},
    }


COMMIT = f"/api/datasets/{REPO}/commit/main"
SHA = hashlib.sha256(b"x").hexdigest()

MALFORMED = [
    ("POST", "/api/repos/create", b'{"name": "broken', "malformed JSON body"),
    ("POST", "/api/repos/create", b'["name"]', "must be an object"),
    ("POST", "/api/repos/create", b'{"type": "dataset"}', "'name'"),
    ("POST", "/api/repos/create", b'{"name": 5}', "'name'"),
    ("POST", COMMIT, b'{"key": "header", "value": {"summary": "s"}}\n{broken', "malformed NDJSON"),
    ("POST", COMMIT, ndjson(file_op("a.txt")), "exactly one header"),
    ("POST", COMMIT, ndjson(HEADER, {"key": "file", "value": {"path": "a.txt"}}), "'content'"),
    ("POST", COMMIT, ndjson(HEADER, {"key": "file", "value": {"path": "a.txt", "content": "%%"}}), "not base64"),
    ("POST", COMMIT, ndjson(HEADER, {"key": "lfsFile", "value": {"path": "a.parquet", "oid": "xyz"}}), "not a sha256"),
    ("POST", COMMIT, ndjson(HEADER, {"key": "file", "value": "a.txt"}), "'value'"),
    ("POST", f"/datasets/{REPO}.git/info/lfs/objects/batch", b"[1]", "must be an object"),
    (
        "POST",
        f"/datasets/{REPO}.git/info/lfs/objects/batch",
        json.dumps({"objects": [{"oid": "../../x", "size": 1}]}).encode(),
        "not a sha256",
    ),
    ("POST", f"/api/datasets/{REPO}/preupload/main", b'{"files": [{"path": "a.txt"}]}', "'size'"),
    ("POST", f"/api/datasets/{REPO}/tag/main", b"{}", "'tag'"),
    ("POST", f"/api/datasets/{REPO}/paths-info/main", b'{"paths": [1]}', "list of strings"),
]


@pytest.mark.parametrize("method, path, body, message", MALFORMED)
def test_a_malformed_body_is_a_400_with_an_error_and_the_connection_stays_usable(hub, method, path, body, message):
    conn = connect(hub)
    status, answer = send(hub, method, path, body, {"Content-Type": "application/json"}, conn)
    assert status == 400 and message in answer["error"], answer
    # The same kept-alive connection serves the next request: nothing was left half-read.
    assert send(hub, "GET", f"/api/datasets/{REPO}/revision/main", conn=conn)[0] == 200


BAD_PATHS = [
    "../secret.txt",
    "data/../../secret.txt",
    "/etc/passwd",
    "data//a.txt",
    "data\\a.txt",
    "./a.txt",
    ".git/config",
    "a\nb.txt",
    "",
]


@pytest.mark.parametrize("path", BAD_PATHS)
def test_file_paths_the_hub_refuses_are_refused_in_commits_and_preupload(hub, path):
    status, answer = send(hub, "POST", COMMIT, ndjson(HEADER, file_op(path)))
    assert status == 400 and "invalid file path" in answer["error"], answer
    status, answer = send(
        hub,
        "POST",
        f"/api/datasets/{REPO}/preupload/main",
        json.dumps({"files": [{"path": path, "size": 1}]}).encode(),
    )
    assert status == 400 and "invalid file path" in answer["error"], answer
    status, tree = send(hub, "GET", f"/api/datasets/{REPO}/tree/main?recursive=true")
    assert status == 200 and {e["path"] for e in tree} == {".gitattributes"}


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", f"/datasets/{REPO}/resolve/main/..%2F..%2Fsecret.txt"),
        ("GET", f"/datasets/{REPO}/resolve/main/data%5Ca.txt"),
        ("GET", f"/api/datasets/{REPO}/tree/main/..%2Fdata"),
        ("GET", "/api/datasets/../raw/revision/main"),
        ("GET", "/api/datasets/tester/..%2Fraw/revision/main"),
        ("GET", "/api/datasets/tester/a--b/revision/main"),
    ],
)
def test_repo_ids_and_paths_in_urls_are_refused(hub, method, path):
    status, answer = send(hub, method, path)
    assert status == 400 and "invalid" in answer["error"], answer


@pytest.mark.parametrize(
    "body",
    [
        {"name": "..", "type": "dataset"},
        {"name": "ok", "organization": "../x", "type": "dataset"},
        {"name": "a/b", "type": "dataset"},
        {"name": "ok", "type": "bucket"},
    ],
)
def test_a_repo_the_hub_refuses_is_not_created(hub, body):
    status, answer = send(hub, "POST", "/api/repos/create", json.dumps(body).encode())
    assert status == 400 and answer["error"], answer


def test_broken_chunked_framing_is_a_400_that_closes_the_connection(hub):
    conn = connect(hub)
    conn.putrequest("POST", "/api/repos/create")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    conn.send(b"zz\r\nnot a chunk\r\n0\r\n\r\n")
    response = conn.getresponse()
    assert response.status == 400 and "framing" in json.loads(response.read())["error"]
    assert response.getheader("Connection") == "close"


def test_a_malformed_range_is_a_400(hub):
    assert send(hub, "POST", COMMIT, ndjson(HEADER, file_op("a.txt", b"hello")))[0] == 200
    status, answer = send(hub, "GET", f"/datasets/{REPO}/resolve/main/a.txt", headers={"Range": "bytes=x-y"})
    assert status == 400 and "Range" in answer["error"]
    conn = connect(hub)
    conn.request("GET", f"/datasets/{REPO}/resolve/main/a.txt", headers={"Range": "bytes=1-3"})
    assert conn.getresponse().read() == b"ell"
