"""Shared test set-up: an offline Hugging Face environment pointed at a local Hub.

The Hub endpoint must be in the environment before huggingface_hub / datasets are imported (they
read it into module constants), so the port is chosen here at import time and the server itself
is started lazily by the `local_hub` fixture.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Imports no HF library, so the environment below is still read by them at their import.
from builders.infra.local_hub import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]


_SESSION_TMP = Path(tempfile.mkdtemp(prefix="counterfactory-tests-"))
HUB_PORT = free_port()
os.environ.update(
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

# The ECCV machine-in-the-loop round shared by test_eccv_positives_mitl.py and
# test_eccv_positives_ingest.py: session fixtures, so it is built once for both files.
pytest_plugins = ["eccv_mitl_fixtures"]


@pytest.fixture(scope="session")
def session_tmp() -> Path:
    return _SESSION_TMP


@pytest.fixture(scope="session")
def local_hub():
    """A Hub-compatible HTTP server on 127.0.0.1 that the real clients talk to."""
    from builders.infra.local_hub import LocalHub

    hub = LocalHub(port=HUB_PORT)
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture(scope="session")
def nltk_data_dir() -> Path:
    """Offline NLTK data: the tagger trained on the project's hand-tagged corpus."""
    from builders.infra.text.nltk_setup import install_offline_tagger

    path = Path(os.environ["NLTK_DATA"])
    install_offline_tagger(path)
    return path


@pytest.fixture(scope="session")
def tiny_models_dir() -> Path:
    """The tiny random-init model profile, built once per session."""
    from builders.infra.models.tiny import build_tiny_models

    path = _SESSION_TMP / "tiny_models"
    build_tiny_models(path)
    return path


@pytest.fixture(scope="session")
def coco_fixture_dir() -> Path:
    """A tiny COCO-format source (images, captions, instances, Karpathy split)."""
    from builders.infra.fixtures.coco import CocoFixtureConfig, write_coco_fixture

    path = _SESSION_TMP / "coco"
    write_coco_fixture(path, CocoFixtureConfig())
    return path


def pytest_sessionfinish(session, exitstatus):
    import shutil

    shutil.rmtree(_SESSION_TMP, ignore_errors=True)
