"""Talking to a Hub: endpoint set-up, bounded time per request, back-off, one-line errors.

- `use_endpoint(url)` makes `--endpoint URL` alone enough: `huggingface_hub` reads `HF_ENDPOINT`
  and `HF_HUB_DISABLE_XET` when it is imported, and a Hub other than huggingface.co (the local
  Hub, a self-hosted one) has no Xet storage, so LFS uploads must not be routed there.
- `bound_request_time(seconds)`: `huggingface_hub`'s HTTP client has no timeout, so a server that
  stops answering hangs a publish forever; every request gets connect/read/write limits instead.
- `retrying(call, ...)`: back-off on 429/5xx and on the HTTP client's transport errors (the
  client raises `httpx2` errors, not the built-in `ConnectionError`/`TimeoutError`).
- `hub_errors(...)`: what is left becomes one `PublishError` line saying what to do.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

from builders.infra.errors import PublishError

log = logging.getLogger(__name__)
T = TypeVar("T")

OFFICIAL_HUB = "https://huggingface.co"
#: Statuses worth retrying: rate limits and server-side failures.
RETRY_STATUSES = (429, 500, 502, 503, 504)
# The Hub's rules: ORG/NAME, each part letters, digits, '-', '_', '.', no '--' or '..', ≤ 96 chars.
_REPO_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")


class PublishInterrupted(PublishError, ConnectionError):
    """The connection to the Hub failed or timed out (after retries): re-running resumes."""


def check_repo_id(repo_id: str) -> None:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise PublishError(f"--repo-id {repo_id!r} must be ORG/NAME (an organisation or user name, "
                           "a slash, and the dataset name), e.g. my-org/coco-captions")
    bad = [p for p in parts if not _REPO_PART.match(p) or "--" in p or ".." in p]
    if bad or len(repo_id) > 96:
        raise PublishError(f"--repo-id {repo_id!r} is not a valid Hub repo id: use letters, digits, "
                           "'-', '_' and '.', not starting or ending with '-' or '.', at most 96 characters")


def use_endpoint(endpoint: str | None) -> str:
    """Point the Hub client at `endpoint` (default: `HF_ENDPOINT`, else huggingface.co)."""
    url = (endpoint or os.environ.get("HF_ENDPOINT") or OFFICIAL_HUB).rstrip("/")
    if endpoint:
        os.environ["HF_ENDPOINT"] = url
    if url != OFFICIAL_HUB:
        os.environ["HF_HUB_DISABLE_XET"] = "1"
        constants = sys.modules.get("huggingface_hub.constants")
        if constants is not None:  # already imported (a library user, the tests): read at call time
            constants.HF_HUB_DISABLE_XET = True
    return url


def bound_request_time(seconds: float) -> None:
    """Give every request of the shared Hub client connect/read/write limits of `seconds`."""
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils import _http

    def fill_missing_timeouts(request) -> None:
        # Calls that pass `timeout=None` explicitly would otherwise wait forever.
        given = request.extensions.get("timeout") or {}
        request.extensions["timeout"] = {
            k: given.get(k) if given.get(k) is not None else seconds
            for k in ("connect", "read", "write", "pool")
        }

    def factory():
        client = _http.default_client_factory()
        client.event_hooks["request"].append(fill_missing_timeouts)
        return client

    set_client_factory(factory)


def _transport_errors() -> tuple[type[BaseException], ...]:
    import httpx2

    return (httpx2.TransportError, ConnectionError, TimeoutError)


def retrying(call: Callable[[], T], retries: int, what: str) -> T:
    """Run `call`, retrying with exponential back-off on 429/5xx and connection failures."""
    from huggingface_hub.errors import HfHubHTTPError

    delay = 1.0
    for attempt in range(1, retries + 1):
        try:
            return call()
        except HfHubHTTPError as err:
            status = err.response.status_code if err.response is not None else None
            if status not in RETRY_STATUSES or attempt == retries:
                raise
            log.warning("%s failed with HTTP %s; retrying in %.0f s", what, status, delay)
        except _transport_errors() as err:
            if attempt == retries:
                raise
            log.warning("%s failed (%s); retrying in %.0f s", what, err or type(err).__name__, delay)
        time.sleep(delay)
        delay = min(delay * 2, 60.0)
    raise AssertionError("unreachable")


@contextmanager
def hub_errors(endpoint: str, repo_id: str, resume_hint: str) -> Iterator[None]:
    """Turn what the Hub client raises into one line naming the cause and what to do."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError, OfflineModeIsEnabled

    try:
        yield
    except PublishError:
        raise
    except OfflineModeIsEnabled as err:
        raise PublishError(f"{err}".splitlines()[0]) from err
    except LocalTokenNotFoundError as err:
        raise PublishError(f"no Hugging Face token found for {endpoint}: set HF_TOKEN or run "
                           "`hf auth login`") from err
    except httpx2.TimeoutException as err:
        raise PublishInterrupted(f"the Hub at {endpoint} did not answer in time "
                                 f"({type(err).__name__}); {resume_hint}") from err
    except (httpx2.TransportError, ConnectionError, TimeoutError) as err:
        raise PublishInterrupted(f"cannot reach the Hub at {endpoint} ({type(err).__name__}: "
                                 f"{str(err) or 'connection lost'}); check the network and "
                                 f"--endpoint / HF_ENDPOINT, then {resume_hint}") from err
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else None
        server = (getattr(err, "server_message", None) or str(err)).splitlines()[0]
        hint = resume_hint
        if status in (401, 403):
            hint = (f"check the token (HF_TOKEN or `hf auth login`) and that it may write to "
                    f"{repo_id.split('/')[0]}")
        elif status == 412:
            hint = (f"the repo's main branch moved during the publish (another publish to {repo_id}?); "
                    f"{resume_hint}")
        raise PublishError(f"the Hub at {endpoint} answered HTTP {status} ({server}); {hint}") from err
