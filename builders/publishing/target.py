"""Where a version goes: the repo, its tag and the Hub settings that datasets and metric Spaces
share (`PublishConfig` and `MetricPublishConfig` add what they publish)."""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from builders.engine.errors import UserFacingError
from builders.publishing.hub_client import bound_request_time, check_repo_id, hub_errors, use_endpoint

# ASCII digits only: `\d` would also take `１` or `١`, and `$` a trailing newline.
VERSION_RE = re.compile(r"v[0-9]+\.[0-9]+\.[0-9]+", re.ASCII)


def check_version(version: str) -> None:
    if not VERSION_RE.fullmatch(version):
        raise UserFacingError(f"--version {version!r} must look like v1.2.3")


@dataclass
class HubTarget:
    #: `ORG/NAME` of the repo (created when missing).
    repo_id: str
    #: Semantic version tag, e.g. `v1.0.0`; tags are immutable.
    version: str
    #: Hub URL; default is `HF_ENDPOINT` / huggingface.co.
    endpoint: str | None = None
    private: bool = False
    #: Seconds a request may wait to connect, send or receive before it counts as failed
    #: (without it a Hub that stops answering hangs the publish forever).
    timeout_s: float = 120.0

    def check(self) -> None:
        """Refuse a bad version or repo id before anything is read or sent."""
        check_version(self.version)
        check_repo_id(self.repo_id)

    @contextmanager
    def session(self, fix: str) -> Iterator[str]:
        """The endpoint URL, with bounded requests; Hub failures become one line ending in `fix`."""
        endpoint = use_endpoint(self.endpoint)
        bound_request_time(self.timeout_s)
        with hub_errors(endpoint, self.repo_id, fix):
            yield endpoint
