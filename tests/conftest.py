"""Shared test set-up: a hermetic, offline environment pointed at a local Hub.

The Hub endpoint must be in the environment before huggingface_hub / datasets are imported (they
read it into module constants), so the port is chosen here at import time and the server itself
is started lazily by the `local_hub` fixture.

Tests never read the user's home folder, caches or NLTK data (a user who followed the README has
a tagger in ~/nltk_data and models in ~/.cache): the session gets a temporary HOME and XDG
folders, its own Hugging Face, torch and matplotlib folders, and the user's own settings for
those libraries are dropped, all before any of them is imported; subprocesses inherit it. NLTK
searches only the project's data (system-wide folders such as /usr/share/nltk_data are dropped
from its path here; a subprocess that must find no NLTK data confines its own path). Kept: the
user's pip and git settings (package index, trusted folders), which decide how things install,
not what a test computes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Imports no HF library, so the environment below is still read by them at their import.
from builders.devtools.local_hub import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]


#: The user's real home, for tests that check nothing of it leaks into an output.
REAL_HOME = Path.home()
_SESSION_TMP = Path(tempfile.mkdtemp(prefix="counterfactory-tests-"))
_HOME = _SESSION_TMP / "home"
HUB_PORT = free_port()
#: User settings that would point a library at the user's own files, caches or Hub.
_USER_SETTINGS = (
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_DATASETS_CACHE",
    "TRANSFORMERS_CACHE",
    "HF_ASSETS_CACHE",
    "HF_XET_CACHE",
    "HF_TOKEN_PATH",
    "HF_STORED_TOKENS_PATH",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "SENTENCE_TRANSFORMERS_HOME",
    "MATPLOTLIBRC",
    "TORCH_EXTENSIONS_DIR",
)


def _user_tool_settings() -> dict[str, str]:
    """The user's pip and git configuration files, named explicitly so the temporary HOME keeps
    them (pip's package index, git's safe.directory)."""
    config = Path(os.environ.get("XDG_CONFIG_HOME") or REAL_HOME / ".config")
    found = {}
    for var, candidates in (
        ("PIP_CONFIG_FILE", (config / "pip" / "pip.conf", REAL_HOME / ".pip" / "pip.conf")),
        ("GIT_CONFIG_GLOBAL", (REAL_HOME / ".gitconfig", config / "git" / "config")),
    ):
        existing = [c for c in candidates if c.is_file()]
        if var not in os.environ and existing:
            found[var] = str(existing[0])
    return found


def _worker_threads() -> dict[str, str]:
    """Each pytest-xdist worker's share of the CPUs as its torch/OpenMP thread count (unless the
    user set one). Left at torch's default (every core for each worker), the workers' OpenMP
    threads outnumber the cores and spin-wait on each other: measured on 2 cores with 2 workers,
    two of the heaviest test files took 5.5x as long as with one thread per worker."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return {}
    # The CPUs this process may use (Linux), else all of them (macOS has no affinity call).
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"OMP_NUM_THREADS": str(max(1, cpus // workers))}


# Before torch is imported (it reads the thread count once); subprocesses inherit it.
os.environ.update(_worker_threads())
os.environ.update(_user_tool_settings())
for _name in _USER_SETTINGS:
    os.environ.pop(_name, None)
for _folder in ("home", "xdg_cache", "xdg_config", "xdg_data", "xdg_state"):
    (_SESSION_TMP / _folder).mkdir()
os.environ.update(
    HOME=str(_HOME),
    XDG_CACHE_HOME=str(_SESSION_TMP / "xdg_cache"),
    XDG_CONFIG_HOME=str(_SESSION_TMP / "xdg_config"),
    XDG_DATA_HOME=str(_SESSION_TMP / "xdg_data"),
    XDG_STATE_HOME=str(_SESSION_TMP / "xdg_state"),
    TORCH_HOME=str(_SESSION_TMP / "torch"),
    MPLCONFIGDIR=str(_SESSION_TMP / "matplotlib"),
    HF_ENDPOINT=f"http://127.0.0.1:{HUB_PORT}",
    HF_HUB_DISABLE_XET="1",  # otherwise LFS files go to Xet and 404 on the local Hub
    HF_TOKEN="hf_test_dummy_token",
    HF_HOME=str(_SESSION_TMP / "hf_home"),
    HF_MODULES_CACHE=str(_SESSION_TMP / "hf_modules"),
    HF_METRICS_CACHE=str(_SESSION_TMP / "hf_metrics"),
    HF_HUB_DISABLE_TELEMETRY="1",
    HF_DATASETS_DISABLE_PROGRESS_BARS="1",
    TOKENIZERS_PARALLELISM="false",
    # Project-local NLTK data (a tagger trained on the shipped hand-tagged corpus).
    NLTK_DATA=str(REPO_ROOT / ".nltk_data"),
    COUNTERFACTORY_CACHE=str(REPO_ROOT / ".cache"),
)
import nltk  # noqa: E402  (after HOME and NLTK_DATA are set: its search path is fixed at import)

nltk.data.path[:] = [os.environ["NLTK_DATA"]]

# The ECCV machine-in-the-loop round shared by test_eccv_positives_mitl.py and
# test_eccv_positives_ingest.py: session fixtures, so it is built once for both files.
pytest_plugins = ["helpers.eccv_mitl_fixtures"]


@pytest.fixture(scope="session")
def session_tmp() -> Path:
    return _SESSION_TMP


@pytest.fixture(autouse=True)
def _nltk_search_path():
    """Each test starts with NLTK searching the project's data only (installing a tagger into a
    test's own folder adds that folder to the path)."""
    saved = list(nltk.data.path)
    yield
    nltk.data.path[:] = saved


@pytest.fixture(scope="session")
def real_home() -> Path:
    """The user's home folder (HOME itself is a temporary folder during the tests)."""
    return REAL_HOME


@pytest.fixture(scope="session")
def local_hub():
    """A Hub-compatible HTTP server on 127.0.0.1 that the real clients talk to."""
    from builders.devtools.local_hub import LocalHub

    hub = LocalHub(port=HUB_PORT)
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture(scope="session")
def nltk_data_dir() -> Path:
    """Offline NLTK data: the tagger trained on the project's hand-tagged corpus."""
    from builders.engine.nltk_setup import install_offline_tagger

    path = Path(os.environ["NLTK_DATA"])
    install_offline_tagger(path)
    return path


@pytest.fixture(scope="session")
def tiny_models_dir() -> Path:
    """The tiny random-init model profile, built once per session."""
    from builders.models.tiny import build_tiny_models

    path = _SESSION_TMP / "tiny_models"
    build_tiny_models(path)
    return path


@pytest.fixture(scope="session")
def tiny_families_dir(tiny_models_dir) -> Path:
    """The tiny cross-encoders (BLIP ITM, BridgeTower, ViLT, FLAVA), as `counterfactory models
    tiny DIR` builds them beside the tiny models."""
    from builders.models.tiny_families import build_tiny_families

    path = tiny_models_dir / "families"
    build_tiny_families(path)
    return path


@pytest.fixture(scope="session")
def coco_fixture_dir() -> Path:
    """A tiny COCO-format source (images, captions, instances, Karpathy split)."""
    from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture

    path = _SESSION_TMP / "coco"
    write_coco_fixture(path, CocoFixtureConfig())
    return path


#: The longest test files (minutes each: every README command, the whole demo), started first so
#: that on parallel workers (`make test`) none is left running alone at the end.
LONGEST_FIRST = ("test_readme_commands.py", "test_demo.py")


#: GB the suite writes to the temp folder and .cache/ (about 1 GB, measured 2026-11-29), with room.
DISK_NEEDED_GB = 3


def pytest_configure(config):
    """On a fuller disk the tests fail with errors that do not name the cause: stop first, saying
    so (once, in the main process)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for place in (tempfile.gettempdir(), REPO_ROOT):
        free = shutil.disk_usage(place).free / 2**30
        if free < DISK_NEEDED_GB:
            raise pytest.UsageError(
                f"{free:.1f} GB free where the tests write ({place}); they need {DISK_NEEDED_GB} GB: free some space"
            )


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable: the rest keep their order


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SESSION_TMP, ignore_errors=True)


#: Flags that keep headless chromium off the network and away from the user's profile.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1000",
)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless chromium driven by Selenium, for the gallery's browser tests."""
    chromium, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_bin):
        pytest.fail(
            "the gallery browser test needs Debian's chromium and chromedriver: run "
            "`apt-get install -y chromium chromium-driver` (`make test` does it when missing)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(driver_bin))
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


@pytest.fixture
def repo_id(request, local_hub) -> str:
    import re

    return f"tester/{re.sub(r'[^A-Za-z0-9]+', '-', request.node.name)[:60].strip('-')}"


@pytest.fixture
def own_hub(monkeypatch):
    """A second local Hub for tests that stall or kill it; HF_ENDPOINT is restored afterwards."""
    from builders.devtools.local_hub import LocalHub

    monkeypatch.setenv("HF_ENDPOINT", os.environ["HF_ENDPOINT"])
    hub = LocalHub().start()
    yield hub
    hub.stall(False)
    hub.stop()
    # The request limit is process-wide: give later tests the default back, not a test's 0.5 s.
    from builders.publishing.hub_client import bound_request_time

    from builders.publishing.target import HubTarget

    bound_request_time(HubTarget.timeout_s)


@pytest.fixture
def meta_nonzero():
    """Meta-device forwards that assign rows by index (`query[dst] = query[src]`, the attention
    injections) ask the meta device for the index's nonzero entries, which it cannot know; every
    such index is row positions, all nonzero, which this torch setting assumes. Set through the
    config module's own `patch` (monkeypatching the attribute breaks it for later tests)."""
    import torch.fx.experimental._config as fx_config

    with fx_config.patch(meta_nonzero_assume_all_nonzero=True):
        yield
