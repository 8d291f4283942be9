"""A local, in-memory server speaking the subset of the Hugging Face Hub HTTP API our clients use.

Tests and the demo point the *real* `huggingface_hub`, `datasets` and `evaluate` clients at it
(`HF_ENDPOINT=http://127.0.0.1:PORT HF_HUB_DISABLE_XET=1 HF_TOKEN=...`), so publishing, tags,
configs, streaming and `evaluate.load` from a Space are exercised end to end without network.
Covered: repo create/info, preupload, NDJSON commits (regular + LFS), LFS batch/PUT, branches,
tags (409 when one exists: tags are immutable), refs, tree (with LFS sha256), paths-info,
commits (412 when `parentCommit` is not the branch head), resolve (HEAD/GET/Range) for model,
dataset and space repos. Malformed bodies and the repo ids and file paths the Hub refuses get
400 with `{"error": ...}` (see `local_hub_requests`). For failure tests, `LocalHub.stall()` makes
it stop answering, `LocalHub.inject(Fault(...))` makes it give a wrong answer to some requests,
and a stopped hub's `state` can be served again by a new `LocalHub` (a restart).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

from builders.devtools.local_hub_requests import (
    BadRequest,
    Fault,
    byte_range,
    commit_lines,
    json_body,
    json_field,
    read_body,
    repo_id,
    repo_path,
    sha256_oid,
)
from builders.devtools.local_hub_state import HubState, Repo, StoredFile
from builders.publishing.publish import git_blob_oid

log = logging.getLogger(__name__)

#: Files the Hub stores through LFS (push_to_hub requires `lfs` for parquet shards).
LFS_SUFFIXES = (".parquet", ".arrow", ".safetensors", ".bin", ".png", ".jpg", ".jpeg")
LFS_MIN_BYTES = 10_000_000
REPO_TYPES = {"datasets": "dataset", "spaces": "space", "models": "model", None: "model"}


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (clients read HF_ENDPOINT before the server starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: HubState  # set on the per-server subclass

    def log_message(self, fmt, *args):  # route through logging, quietly
        log.debug("%s %s", self.address_string(), fmt % args)

    # ---------------------------------------------------------------- plumbing
    def _send(self, code: int, body=b"", headers: dict | None = None, head: bool = False) -> None:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, code: int, error_code: str, msg: str, head: bool = False) -> None:
        self._send(code, {"error": msg}, {"X-Error-Code": error_code, "X-Error-Message": msg}, head)

    def _host(self) -> str:
        return f"http://{self.headers['Host']}"

    def _repo(self, rtype: str, rid: str, head: bool = False) -> Repo | None:
        repo = self.state.repos.get((rtype, rid))
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository {rid} not found", head)
        return repo

    @staticmethod
    def _file_entry(path: str, f: StoredFile) -> dict:
        entry = {"type": "file", "oid": git_blob_oid(f.data), "size": len(f.data), "path": path}
        if f.lfs_sha256:
            entry["lfs"] = {"oid": f.lfs_sha256, "size": len(f.data), "pointerSize": 134}
        return entry

    def _tree(self, files: dict[str, StoredFile], prefix: str, recursive: bool) -> list[dict]:
        prefix = prefix.strip("/")
        out, dirs = [], {}
        for p, f in sorted(files.items()):
            if prefix and not p.startswith(prefix + "/"):
                continue
            parts = (p[len(prefix) + 1 :] if prefix else p).split("/")
            for i in range(1, len(parts) if recursive else min(len(parts), 2)):
                d = "/".join(([prefix] if prefix else []) + parts[:i])
                dirs.setdefault(
                    d, {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
                )
            if recursive or len(parts) == 1:
                out.append(self._file_entry(p, f))
        return list(dirs.values()) + out

    # ---------------------------------------------------------------- routing
    def do_GET(self):
        self._route("GET")

    def do_HEAD(self):
        self._route("HEAD")

    def do_POST(self):
        self._route("POST")

    def do_PUT(self):
        self._route("PUT")

    def _route(self, method: str) -> None:
        while self.state.stalled.is_set() and not self.state.stopping.wait(0.05):
            pass
        if self.state.stalled.is_set() or self.state.stopping.is_set():
            # Hang up without an answer: a stalled or stopped server, also on kept-alive connections.
            self.close_connection = True
            return None
        head = method == "HEAD"
        try:
            # Read up front, so that no answer (404, 400) leaves a body to be misread as a request.
            self.raw = read_body(self.rfile, self.headers) if method in ("POST", "PUT") else b""
        except BadRequest as err:
            # The framing is lost: what follows on this connection is not a request.
            self.close_connection = True
            return self._send(400, {"error": str(err)}, {"X-Error-Code": "BadRequest", "Connection": "close"}, head)
        path = urlparse(self.path).path
        with self.state.lock:
            fault = next((f for f in self.state.faults if f.matches(method, path)), None)
        if fault is not None:
            return self._send(fault.status, fault.body, {"Content-Type": "application/json"}, head)
        try:
            return self._dispatch(method, head)
        except BadRequest as err:
            return self._error(400, "BadRequest", str(err), head)

    def _dispatch(self, method: str, head: bool) -> None:
        url = urlparse(self.path)
        path, query = url.path, parse_qs(url.query)
        if path == "/api/whoami-v2":
            return self._send(
                200,
                {
                    "type": "user",
                    "name": "tester",
                    "orgs": [],
                    "auth": {"type": "access_token", "accessToken": {"role": "write"}},
                },
                head=head,
            )
        if path == "/api/validate-yaml" and method == "POST":
            return self._send(200, {"errors": [], "warnings": []})
        if path == "/api/repos/create" and method == "POST":
            return self._create_repo()
        m = re.match(r"^/api/(model|dataset|space)s/([^/]+/[^/]+)(?:/(.*))?$", path)
        if m:
            repo = self._repo(m.group(1), repo_id(unquote(m.group(2))), head)
            if repo is not None:
                self._api(method, m.group(1), m.group(2), repo, m.group(3) or "", query, head)
            return None
        m = re.match(r"^/(?:(datasets|spaces)/)?([^/]+/[^/]+)\.git/info/lfs/objects/batch$", path)
        if m and method == "POST":
            return self._lfs_batch()
        m = re.match(r"^/_lfs/([0-9a-f]{64})$", path)
        if m and method == "PUT":
            data = self.raw
            if hashlib.sha256(data).hexdigest() != m.group(1):
                return self._error(400, "BadRequest", "sha256 mismatch")
            with self.state.lock:
                self.state.lfs[m.group(1)] = data
            return self._send(200, {})
        m = re.match(r"^/(?:(datasets|spaces|models)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m and method in ("GET", "HEAD"):
            return self._resolve(
                REPO_TYPES[m.group(1)], repo_id(unquote(m.group(2))), m.group(3), repo_path(unquote(m.group(4))), head
            )
        return self._error(404, "NotFound", f"no route {method} {path}", head)

    def _create_repo(self) -> None:
        p = json_body(self.raw, empty={})
        rtype = json_field(p, "type", str, optional=True) or "model"
        if rtype not in ("model", "dataset", "space"):
            raise BadRequest(f"unknown repo type {rtype!r}")
        org = json_field(p, "organization", str, optional=True) or "tester"
        rid = repo_id(f"{org}/{json_field(p, 'name', str)}")
        url = f"{self._host()}/{'' if rtype == 'model' else rtype + 's/'}{rid}"
        with self.state.lock:
            if (rtype, rid) in self.state.repos:
                return self._send(409, {"error": "You already created this repo", "url": url})
            repo = self.state.repos[(rtype, rid)] = Repo(private=bool(p.get("private")))
            attrs = StoredFile(b"*.parquet filter=lfs diff=lfs merge=lfs -text\n")
            repo.branches["main"] = repo.add_commit(None, {".gitattributes": attrs}, "initial commit")
        return self._send(200, {"url": url, "name": rid})

    def _lfs_batch(self) -> None:
        objects = []
        for o in json_field(json_body(self.raw), "objects", list):
            if not isinstance(o, dict):
                raise BadRequest("each LFS object must be a JSON object")
            obj = {"oid": sha256_oid(o.get("oid")), "size": json_field(o, "size", int), "authenticated": True}
            if o["oid"] not in self.state.lfs:
                obj["actions"] = {"upload": {"href": f"{self._host()}/_lfs/{o['oid']}"}}
            objects.append(obj)
        self._send(200, {"transfer": "basic", "objects": objects}, {"Content-Type": "application/vnd.git-lfs+json"})

    def _resolve(self, rtype: str, rid: str, rev: str, fpath: str, head: bool) -> None:
        repo = self._repo(rtype, rid, head)
        if repo is None:
            return
        sha = repo.resolve(rev)
        if sha is None:
            return self._error(404, "RevisionNotFound", "Revision not found", head)
        stored = repo.commits[sha].files.get(fpath)
        if stored is None:
            return self._error(404, "EntryNotFound", f"{fpath} not found", head)
        data = stored.data
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{stored.lfs_sha256 or git_blob_oid(data)}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if stored.lfs_sha256:
            headers["X-Linked-Etag"] = f'"{stored.lfs_sha256}"'
            headers["X-Linked-Size"] = len(data)
        rng = self.headers.get("Range")
        if rng and not head:
            start, end = byte_range(rng, len(data))
            chunk = data[start : end + 1]
            headers["Content-Range"] = f"bytes {start}-{start + len(chunk) - 1}/{len(data)}"
            return self._send(206, chunk, headers)
        if head:
            self.send_response(200)
            for k, v in headers.items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return None
        return self._send(200, data, headers)

    def _api(self, method, rtype, rid, repo: Repo, rest, query, head) -> None:
        op, _, arg = rest.partition("/")
        if op in ("", "revision") and method in ("GET", "HEAD"):
            return self._repo_info(rid, repo, arg or "main", head)
        if op == "refs" and method == "GET":

            def fmt(kind, refs):
                return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": s} for n, s in refs.items()]

            return self._send(
                200, {"branches": fmt("heads", repo.branches), "tags": fmt("tags", repo.tags), "converts": []}
            )
        if op in ("branch", "tag") and method == "POST":
            return self._create_ref(repo, op, unquote(arg))
        if op == "preupload" and method == "POST":
            return self._preupload()
        if op == "commit" and method == "POST":
            return self._commit(rtype, rid, repo, unquote(arg))
        if op == "tree" and method == "GET":
            rev, _, sub = arg.partition("/")
            sha = repo.resolve(rev)
            if sha is None:
                return self._error(404, "RevisionNotFound", "Revision not found")
            files, sub = repo.commits[sha].files, unquote(sub)
            if sub:
                repo_path(sub.rstrip("/"))
            if sub and sub in files:
                return self._error(404, "EntryNotFound", "not a directory")
            entries = self._tree(files, sub, query.get("recursive", ["false"])[0].lower() == "true")
            if sub and not entries:
                return self._error(404, "EntryNotFound", f"{sub} does not exist")
            return self._send(200, entries)
        if op == "paths-info" and method == "POST":
            return self._paths_info(repo, arg)
        if op == "commits" and method == "GET":
            sha, out = repo.resolve(arg or "main"), []
            while sha:
                c = repo.commits[sha]
                out.append(
                    {"id": sha, "title": c.title, "message": "", "authors": [{"user": "tester"}], "date": c.date}
                )
                sha = c.parent
            return self._send(200, out)
        return self._error(404, "NotFound", f"no api route {method} {rest}", head)

    def _preupload(self) -> None:
        answers = []
        for f in json_field(json_body(self.raw), "files", list):
            if not isinstance(f, dict):
                raise BadRequest("each file must be a JSON object")
            path, size = repo_path(f.get("path")), json_field(f, "size", int)
            lfs = path.lower().endswith(LFS_SUFFIXES) or size >= LFS_MIN_BYTES
            answers.append({"path": path, "shouldIgnore": False, "uploadMode": "lfs" if lfs else "regular"})
        return self._send(200, {"files": answers})

    def _repo_info(self, rid: str, repo: Repo, rev: str, head: bool) -> None:
        sha = repo.resolve(rev)
        if sha is None:
            return self._error(404, "RevisionNotFound", "Revision not found", head)
        c = repo.commits[sha]
        self._send(
            200,
            {
                "_id": rid,
                "id": rid,
                "author": rid.split("/")[0],
                "sha": sha,
                "private": repo.private,
                "disabled": False,
                "gated": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "lastModified": c.date,
                "createdAt": c.date,
                "siblings": [{"rfilename": p, "size": len(f.data)} for p, f in sorted(c.files.items())],
            },
            head=head,
        )

    def _create_ref(self, repo: Repo, op: str, name: str) -> None:
        p = json_body(self.raw, empty={})
        with self.state.lock:
            if op == "branch":
                if name in repo.branches:
                    return self._error(409, "BranchExists", "Reference already exists")
                start = repo.resolve(json_field(p, "startingPoint", str, optional=True) or "main")
                if start is None:
                    return self._error(404, "RevisionNotFound", "Revision not found")
                repo.branches[name] = start
            else:
                sha = repo.resolve(name)
                if sha is None:
                    return self._error(404, "RevisionNotFound", "Revision not found")
                tag = json_field(p, "tag", str)
                if tag in repo.tags:
                    return self._error(409, "TagExists", f"Tag {tag} already exists")
                repo.tags[tag] = sha
        return self._send(200, {})

    def _commit(self, rtype: str, rid: str, repo: Repo, branch: str) -> None:
        header, ops = commit_lines(self.raw)
        with self.state.lock:
            parent = repo.branches.get(branch)
            if parent is None:
                return self._error(404, "RevisionNotFound", f"branch {branch} not found")
            if header.get("parentCommit") and header["parentCommit"] != parent:
                return self._error(412, "PreconditionFailed", "parent commit is not the head of the branch")
            files = dict(repo.commits[parent].files)
            for key, v in ops:
                if key == "file":
                    files[v["path"]] = StoredFile(v["content"])
                elif key == "deletedFile":
                    files.pop(v["path"], None)
                elif key == "deletedFolder":
                    folder = v["path"].rstrip("/") + "/"
                    for fp in [fp for fp in files if fp.startswith(folder)]:
                        files.pop(fp)
                elif key == "lfsFile":
                    if v["oid"] not in self.state.lfs:
                        return self._error(422, "LfsObjectMissing", f"LFS object {v['oid']} was never uploaded")
                    files[v["path"]] = StoredFile(self.state.lfs[v["oid"]], v["oid"])
            sha = repo.add_commit(parent, files, header["summary"])
            repo.branches[branch] = sha
        prefix = "" if rtype == "model" else rtype + "s/"
        return self._send(
            200,
            {
                "success": True,
                "commitOid": sha,
                "pullRequestUrl": None,
                "commitUrl": f"{self._host()}/{prefix}{rid}/commit/{sha}",
            },
        )

    def _paths_info(self, repo: Repo, rev: str) -> None:
        sha = repo.resolve(rev)
        if sha is None:
            return self._error(404, "RevisionNotFound", "Revision not found")
        if "json" in self.headers.get("Content-Type", ""):
            paths = json_field(json_body(self.raw), "paths", list)
        else:
            try:
                paths = parse_qs(self.raw.decode(), strict_parsing=bool(self.raw)).get("paths", [])
            except (UnicodeDecodeError, ValueError) as err:
                raise BadRequest(f"malformed form body: {err}") from None
        if not all(isinstance(p, str) for p in paths):
            raise BadRequest("field 'paths' must be a list of strings")
        files, out = repo.commits[sha].files, []
        for p in (p.strip("/") for p in paths):
            if p:
                repo_path(p)
            if p in files:
                out.append(self._file_entry(p, files[p]))
            elif p == "" or any(f.startswith(p + "/") for f in files):
                out.append({"type": "directory", "oid": hashlib.sha1(p.encode()).hexdigest(), "size": 0, "path": p})
        return self._send(200, out)


class LocalHub:
    """Start/stop a local Hub on 127.0.0.1; `url` is what `HF_ENDPOINT` must be set to."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1", state: HubState | None = None) -> None:
        # Passing the `state` of a stopped hub restarts it with the same repos (a server restart).
        self.state = state or HubState()
        self.state.stopping.clear()
        handler = type("BoundHandler", (_Handler,), {"state": self.state})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "LocalHub":
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="local-hub")
        self._thread.start()
        log.info("local Hub listening on %s", self.url)
        return self

    def inject(self, fault: Fault) -> None:
        """Give `fault`'s answer to matching requests from now on (until `clear_faults`)."""
        with self.state.lock:
            self.state.faults.append(fault)

    def clear_faults(self) -> None:
        with self.state.lock:
            self.state.faults.clear()

    def stall(self, stalled: bool = True) -> None:
        """Keep accepting connections but stop answering (or answer again)."""
        (self.state.stalled.set if stalled else self.state.stalled.clear)()

    def stop(self) -> None:
        self.state.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "LocalHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
