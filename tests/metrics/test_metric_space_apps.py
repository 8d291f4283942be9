"""Each metric Space's app starts as the Hub starts it and computes through evaluate's widget.

A stranger downloads the published Space (`snapshot_download`, no token) and runs `python app.py`
in the clean virtualenv of tests/metrics/test_metric_spaces_clean_venv.py, which holds the Spaces'
requirements and the gradio their cards declare (`sdk_version`), never counterfactory. Once the
app serves, `gradio_client` sends one table of inputs to the widget's `/predict`; the answer must
equal what the checkout's module computes in this process from the same inputs.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import evaluate
import pytest
from huggingface_hub import snapshot_download

from builders.app.cli import main as cli_main
from test_metric_spaces_clean_venv import NAMES, SPACES, card_metadata, clean_python  # noqa: F401

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

ORG = "apps"
VERSION = "v1.0.0"
START_SECONDS = 150  # gradio 3 and evaluate import slowly on a busy 2-core machine

CAPTIONS = [
    "a dog on the grass",
    "a man with a dog",
    "a cat on a sofa",
    "a dog and a frisbee",
    "a red car",
    "a person riding a bike",
    "two dogs playing",
    "a bowl of fruit",
    "a dog in a car",
    "a woman holding a dog",
]
# One widget table per Space, its columns in the module's feature order (the widget's headers).
# List cells travel as JSON text, as a user types them into the widget; numbers as numbers.
CASES = {
    "map_at_r": {
        "predictions": [
            [10, 99, 11, 12, 1, 2, 3, 4, 5, 6],
            [99, 10, 11, 12, 7, 8, 9, 1, 2, 3],
            [12, 7, 10, 3, 4, 5, 6, 1, 2, 9],
        ],  # 10 each: R@10 by default
        "references": [[10, 11, 12], [10, 11, 12], [3, 8]],
    },
    "odmap": {
        "retrieved": [CAPTIONS, CAPTIONS[::-1]],  # 10 each: ODmAP@10 by default
        "removed_classes": [["person"], ["person"]],
        "present_classes": [["dog"], ["dog"]],
    },
    "itm_score_deltas": {
        "g_cr_ir": [0.9, 0.8, 0.35],
        "g_cr_io": [0.1, 0.2, 0.4],
        "g_co_ir": [0.3, 0.9, 0.05],
        "g_cc_ics": [0.5, 0.4, 0.7],
        "g_cc_ios": [0.6, 0.1, 0.25],
        "g_co_ics": [0.2, 0.5, 0.45],
    },
}

CLIENT = """
import json, sys
from gradio_client import Client
# gradio_client 0.x sends a Dataframe input as the path of a JSON file {"headers", "data"}.
print(json.dumps(Client(sys.argv[1], verbose=False).predict(sys.argv[2], api_name="/predict")))
"""


@pytest.fixture(scope="module")
def published(local_hub) -> dict[str, str]:
    for name in NAMES:
        assert (
            cli_main(["publish-metric", str(SPACES / name), "--repo-id", f"{ORG}/{name}", "--version", VERSION]) == 0
        )
    return {name: f"{ORG}/{name}" for name in NAMES}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _clean_env(tmp_path: Path, nltk_data: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(
        HF_MODULES_CACHE=str(tmp_path / "modules"),
        HF_METRICS_CACHE=str(tmp_path / "m"),
        NLTK_DATA=str(nltk_data),
        GRADIO_SERVER_NAME="127.0.0.1",
        GRADIO_SERVER_PORT=str(port),
        GRADIO_ANALYTICS_ENABLED="False",
    )
    return env


def _wait_serving(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"app.py exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(url + "config", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    pytest.fail(f"app.py did not serve within {START_SECONDS} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """Ends the app's whole process tree (its own session)."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def _widget_table(case: dict, path: Path) -> Path:
    rows = zip(
        *[[value if isinstance(value, float) else json.dumps(value) for value in column] for column in case.values()],
        strict=True,
    )
    path.write_text(json.dumps({"headers": list(case), "data": [list(row) for row in rows]}))
    return path


@pytest.mark.parametrize("name", NAMES)
def test_space_app_starts_and_computes_through_the_widget(
    clean_python,  # noqa: F811
    published,
    name,
    tmp_path,
    nltk_data_dir,
):
    assert card_metadata(name)["app_file"] == "app.py"
    space = Path(
        snapshot_download(
            published[name], repo_type="space", revision=VERSION, local_dir=tmp_path / "space", token=False
        )
    )
    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    env = _clean_env(tmp_path, nltk_data_dir, port)
    log = tmp_path / "app.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(clean_python), "app.py"],
            cwd=space,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_serving(proc, url, log)
        (tmp_path / "client.py").write_text(CLIENT)
        table = _widget_table(CASES[name], tmp_path / "table.json")
        answer = subprocess.run(
            [str(clean_python), "client.py", url, str(table)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        _stop(proc)
    assert answer.returncode == 0, answer.stderr[-3000:] + log.read_text()[-3000:]
    shown = json.loads(answer.stdout.strip().splitlines()[-1])  # the widget's text box
    expected = evaluate.load(str(SPACES / name)).compute(**CASES[name])
    assert ast.literal_eval(shown) == json.loads(json.dumps(expected))
