"""What the local Hub checks in a request before serving it, and the faults tests make it give.

The real Hub answers a malformed body (broken JSON or NDJSON, a missing or mistyped field, broken
chunked framing) and a repo id or file path it refuses (`..` or empty segments, absolute paths,
backslashes: see `engine.repo_paths`) with HTTP 400 and `{"error": ...}`. The local Hub
does the same through `BadRequest`, instead of dropping the connection on an exception.

`Fault`: an answer given instead of the real one to matching requests (a 200 with garbage JSON,
a failing LFS upload), so tests can check what a publish does against a broken Hub.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any, BinaryIO

from builders.engine.repo_paths import repo_path_problem
from builders.publishing.hub_client import repo_id_problem

_SHA256 = re.compile(r"[0-9a-f]{64}", re.ASCII)


class BadRequest(Exception):
    """The request cannot be served as sent: answered 400 with this message."""


@dataclass(frozen=True)
class Fault:
    """Answer `status` + `body` to requests whose method is `method` and path matches `pattern`."""

    method: str
    pattern: str
    status: int = 200
    body: bytes = b'{"garbage'

    def matches(self, method: str, path: str) -> bool:
        return method == self.method and re.search(self.pattern, path) is not None


def read_body(rfile: BinaryIO, headers) -> bytes:
    """The request body (`Content-Length` or chunked); `BadRequest` when its framing is broken."""
    try:
        if "chunked" in (headers.get("Transfer-Encoding") or "").lower():
            out = b""
            while True:
                size = int(rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size < 0:
                    raise ValueError(size)
                if size == 0:
                    rfile.readline()
                    return out
                out += rfile.read(size)
                rfile.readline()
        n = int(headers.get("Content-Length") or 0)
        if n < 0:
            raise ValueError(n)
        return rfile.read(n) if n else b""
    except ValueError:
        raise BadRequest("malformed request body framing (Content-Length or chunk size)") from None


def json_body(raw: bytes, empty: Any = None) -> dict[str, Any]:
    """The body as a JSON object (`empty` stands for an empty body where that is allowed)."""
    if not raw.strip() and empty is not None:
        return empty
    try:
        value = json.loads(raw)
    except ValueError as err:  # also UnicodeDecodeError
        raise BadRequest(f"malformed JSON body: {err}") from None
    if not isinstance(value, dict):
        raise BadRequest(f"the JSON body must be an object, not {type(value).__name__}")
    return value


def json_field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], optional: bool = False):
    """`obj[key]`, which must be of `kind` (or absent/null when `optional`)."""
    value = obj.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise BadRequest(f"field {key!r} is missing or of the wrong type")
    return value


def repo_path(path: Any) -> str:
    """A file path in a repo, refused as the Hub refuses it."""
    if not isinstance(path, str):
        raise BadRequest("a file path must be a string")
    problem = repo_path_problem(path)
    if problem:
        raise BadRequest(f"invalid file path {path!r}: {problem}")
    return path


def repo_id(rid: str) -> str:
    problem = repo_id_problem(rid)
    if problem:
        raise BadRequest(f"invalid repo id {rid!r}: {problem}")
    return rid


def sha256_oid(value: Any) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise BadRequest(f"invalid LFS oid {value!r}: not a sha256")
    return value


def commit_lines(raw: bytes) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """The header and the operations (key, value) of an NDJSON commit body, checked."""
    try:
        lines = [json.loads(x) for x in raw.decode().splitlines() if x.strip()]
    except ValueError as err:
        raise BadRequest(f"malformed NDJSON commit body: {err}") from None
    ops = []
    for line in lines:
        if not isinstance(line, dict):
            raise BadRequest("each NDJSON line must be an object")
        ops.append((json_field(line, "key", str), json_field(line, "value", dict)))
    headers = [value for key, value in ops if key == "header"]
    if len(headers) != 1:
        raise BadRequest("a commit needs exactly one header line")
    json_field(headers[0], "summary", str)
    json_field(headers[0], "parentCommit", str, optional=True)
    for key, value in ops:
        if key in ("file", "deletedFile", "deletedFolder", "lfsFile"):
            path = json_field(value, "path", str)
            repo_path(path.rstrip("/") if key == "deletedFolder" else path)
        if key == "file":
            try:
                value["content"] = base64.b64decode(json_field(value, "content", str), validate=True)
            except binascii.Error as err:
                raise BadRequest(f"file {value['path']!r}: content is not base64 ({err})") from None
        elif key == "lfsFile":
            sha256_oid(value.get("oid"))
        elif key not in ("header", "deletedFile", "deletedFolder"):
            raise BadRequest(f"unknown commit operation {key!r}")
    return headers[0], [(k, v) for k, v in ops if k != "header"]


def byte_range(header: str, size: int) -> tuple[int, int]:
    """(start, end inclusive) of a `Range: bytes=A-B` header."""
    match = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip(), re.ASCII)
    if not match or not (match[1] or match[2]):
        raise BadRequest(f"malformed Range header {header!r}")
    start = int(match[1]) if match[1] else 0
    end = int(match[2]) if match[2] else size - 1
    return start, end
