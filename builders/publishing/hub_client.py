"""Talking to a Hub: endpoint set-up, bounded time per request, back-off, one-line errors.

- `use_endpoint(url)` makes `--endpoint URL` alone enough: `huggingface_hub` reads `HF_ENDPOINT`
  and `HF_HUB_DISABLE_XET` when it is imported, and a Hub other than huggingface.co (the local
  Hub, a self-hosted one) has no Xet storage, so LFS uploads must not be routed there.
- `bound_request_time(seconds)`: `huggingface_hub`'s HTTP client has no timeout, so a server that
  stops answering hangs a publish forever; every request gets connect/read/write limits instead.
  The same client records the last request of each thread (method and path only: never the
  query, never a header, so never the token), which is how a later error names the request.
- `retrying(call, ...)`: back-off on 429/5xx, on the HTTP client's transport errors (the
  client raises `httpx2` errors, not the built-in `ConnectionError`/`TimeoutError`), on failed
  LFS uploads (which the client wraps in a `RuntimeError`) and on answers that are not what the
  Hub API returns (a 200 with broken or wrongly shaped JSON: a proxy page, a server that is not a
  Hub), which the client lets escape as `ValueError`/`KeyError`/`TypeError`/`AttributeError`.
- `hub_errors(...)`: what is left becomes one `PublishError` line naming the request and saying
  what to do.
- `repo_id_problem(repo_id)`: the repo ids the Hub refuses (file paths: `engine.repo_paths`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

from builders.engine.errors import PublishError

log = logging.getLogger(__name__)
T = TypeVar("T")

OFFICIAL_HUB = "https://huggingface.co"
#: Statuses worth retrying: rate limits and server-side failures.
RETRY_STATUSES = (429, 500, 502, 503, 504)
# The Hub's rules: ORG/NAME, each part letters, digits, '-', '_', '.', no '--' or '..', ≤ 96 chars.
_REPO_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", re.ASCII)


#: Per thread, the method and path of the last request the Hub client sent.
_last_request = threading.local()
_BAD_ANSWER = (ValueError, KeyError, TypeError, AttributeError)


class PublishInterrupted(PublishError, ConnectionError):
    """The connection to the Hub failed or timed out (after retries): re-running resumes."""


class BadHubAnswer(Exception):
    """The Hub answered a request with something that is not a Hub API answer."""

    def __init__(self, request: str, detail: str) -> None:
        super().__init__(f"{request}: {detail}")
        self.request, self.detail = request, detail


def last_request() -> str:
    """`METHOD /path` of this thread's last request (`a request` before any)."""
    return getattr(_last_request, "value", "a request")


def _describe(request) -> str:
    return f"{request.method} {request.url.path}"


def _record_request(request) -> None:
    _last_request.value = _describe(request)


def check_answer(ok: bool, detail: str) -> None:
    """Fail the current call as a bad answer to the last request unless `ok` (e.g. a commit id)."""
    if not ok:
        raise BadHubAnswer(last_request(), detail)


def repo_id_problem(repo_id: str) -> str | None:
    """Why the Hub would refuse `repo_id` (None when it is a valid ORG/NAME)."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        return "not ORG/NAME"
    if len(repo_id) > 96 or any(not _REPO_PART.fullmatch(p) or "--" in p or ".." in p for p in parts):
        return "not a valid Hub repo id"
    return None


def check_repo_id(repo_id: str) -> None:
    problem = repo_id_problem(repo_id)
    if problem == "not ORG/NAME":
        raise PublishError(
            f"--repo-id {repo_id!r} must be ORG/NAME (an organisation or user name, "
            "a slash, and the dataset name), e.g. my-org/coco-captions"
        )
    if problem:
        raise PublishError(
            f"--repo-id {repo_id!r} is not a valid Hub repo id: use letters, digits, "
            "'-', '_' and '.', not starting or ending with '-' or '.', at most 96 characters"
        )


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
            k: given.get(k) if given.get(k) is not None else seconds for k in ("connect", "read", "write", "pool")
        }

    def factory():
        client = _http.default_client_factory()
        client.event_hooks["request"] += [fill_missing_timeouts, _record_request]
        return client

    set_client_factory(factory)


def _transport_errors() -> tuple[type[BaseException], ...]:
    import httpx2

    return (httpx2.TransportError, ConnectionError, TimeoutError)


def _unwrapped(call: Callable[[], T]) -> T:
    """`call()`, with the HTTP error a failed LFS upload carries instead of its `RuntimeError`,
    and a broken answer as a `BadHubAnswer` naming the request it answered."""
    from huggingface_hub.errors import HFValidationError, HfHubHTTPError

    try:
        return call()
    except RuntimeError as err:
        if isinstance(err.__cause__, (HfHubHTTPError, *_transport_errors())):
            raise err.__cause__ from err
        raise
    except (HfHubHTTPError, HFValidationError):  # an HTTP status; a bad argument of ours
        raise
    except _BAD_ANSWER as err:
        raise BadHubAnswer(last_request(), f"{type(err).__name__}: {err}") from err


def retrying(call: Callable[[], T], retries: int, what: str) -> T:
    """Run `call`, retrying with exponential back-off on 429/5xx, connection failures and broken
    answers."""
    from huggingface_hub.errors import HfHubHTTPError

    delay = 1.0
    for attempt in range(1, retries + 1):
        try:
            return _unwrapped(call)
        except HfHubHTTPError as err:
            status = err.response.status_code if err.response is not None else None
            if status not in RETRY_STATUSES or attempt == retries:
                raise
            log.warning("%s failed with HTTP %s; retrying in %.0f s", what, status, delay)
        except (*_transport_errors(), BadHubAnswer) as err:
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
    except BadHubAnswer as err:
        raise PublishError(
            f"the Hub at {endpoint} answered {err.request} with something that is "
            f"not a Hub answer ({err.detail[:200]}); check --endpoint / HF_ENDPOINT "
            f"(a proxy or a server that is not a Hub?), then {resume_hint}"
        ) from err
    except OfflineModeIsEnabled as err:
        raise PublishError(f"{err}".splitlines()[0]) from err
    except LocalTokenNotFoundError as err:
        raise PublishError(f"no Hugging Face token found for {endpoint}: set HF_TOKEN or run `hf auth login`") from err
    except httpx2.TimeoutException as err:
        raise PublishInterrupted(
            f"the Hub at {endpoint} did not answer in time ({type(err).__name__}); {resume_hint}"
        ) from err
    except (httpx2.TransportError, ConnectionError, TimeoutError) as err:
        raise PublishInterrupted(
            f"cannot reach the Hub at {endpoint} ({type(err).__name__}: "
            f"{str(err) or 'connection lost'}); check the network and "
            f"--endpoint / HF_ENDPOINT, then {resume_hint}"
        ) from err
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else None
        request = _describe(err.response.request) if err.response is not None else last_request()
        server = (getattr(err, "server_message", None) or str(err)).splitlines()[0]
        hint = resume_hint
        if status in (401, 403):
            hint = f"check the token (HF_TOKEN or `hf auth login`) and that it may write to {repo_id.split('/')[0]}"
        elif status == 412:
            hint = f"the repo's main branch moved during the publish (another publish to {repo_id}?); {resume_hint}"
        raise PublishError(f"the Hub at {endpoint} answered {request} with HTTP {status} ({server}); {hint}") from err
