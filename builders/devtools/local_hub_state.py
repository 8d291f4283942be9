"""What the local Hub (`local_hub.py`) stores: repos with their commits, branches and tags, and
the LFS objects, all in memory; `HubState` outlives a server, so a new `LocalHub` can serve it
again (a restart)."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import unquote

from builders.devtools.local_hub_requests import Fault


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class StoredFile:
    data: bytes
    #: sha256 of the content when the file went through LFS, else None.
    lfs_sha256: str | None = None


@dataclass
class Commit:
    files: dict[str, StoredFile]
    parent: str | None
    title: str
    date: str = field(default_factory=_now)


@dataclass
class Repo:
    private: bool = False
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def add_commit(self, parent: str | None, files: dict[str, StoredFile], title: str) -> str:
        sha = hashlib.sha1(f"{parent}{title}{time.time_ns()}{sorted(files)}".encode()).hexdigest()
        self.commits[sha] = Commit(files, parent, title)
        return sha

    def resolve(self, rev: str) -> str | None:
        rev = unquote(rev)
        return self.branches.get(rev) or self.tags.get(rev) or (rev if rev in self.commits else None)


class HubState:
    """All repos and LFS objects of one server; every mutation holds `lock`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lfs: dict[str, bytes] = {}
        #: While set, requests are read but never answered (a Hub that stopped responding).
        self.stalled = threading.Event()
        #: Set when the server stops, releasing stalled requests.
        self.stopping = threading.Event()
        #: Wrong answers given instead of the real ones (see `LocalHub.inject`).
        self.faults: list[Fault] = []
