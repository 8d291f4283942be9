"""`counterfactory publish-metric`: a metric module published as a tagged Space on the local Hub
loads with `evaluate.load("ORG/NAME", revision=...)` and computes what the package function does."""

from __future__ import annotations

from pathlib import Path

import evaluate
import numpy as np
import pytest
import yaml
from huggingface_hub import HfApi, hf_hub_download

from builders.app.cli import main as cli_main
from builders.engine.errors import UserFacingError
from counterfactory_metrics.odmap.odmap_scores import odmap_from_topk
from builders.publishing.metric import MetricPublishConfig, publish_metric, space_files

MODULES = Path(__file__).resolve().parents[2] / "evaluate_modules"


def test_published_metric_loads_by_tag_from_the_hub(local_hub, capsys):
    assert (
        cli_main(["publish-metric", str(MODULES / "odmap"), "--repo-id", "tester/odmap", "--version", "v1.0.0"]) == 0
    )
    assert "evaluate.load('tester/odmap', revision='v1.0.0')" in capsys.readouterr().out
    files = {f.path for f in HfApi().list_repo_tree("tester/odmap", repo_type="space", revision="v1.0.0")}
    assert {"odmap.py", "README.md", "app.py", "requirements.txt"} <= files

    module = evaluate.load("tester/odmap", revision="v1.0.0")
    rng = np.random.default_rng(0)
    mentions = rng.random((50, 3)) < 0.4
    topk = np.stack([rng.permutation(50)[:5] for _ in range(8)])  # distinct per query
    removed, present = [["cat"]] * 8, [["dog", "car"]] * 8
    got = module.compute(
        retrieved=topk,
        removed_classes=removed,
        present_classes=present,
        mention_matrix=mentions,
        class_names=["cat", "dog", "car"],
        k_values=[1, 5],
    )
    expected = odmap_from_topk(
        topk, mentions, np.array([[True, False, False]] * 8), np.array([[False, True, True]] * 8), k_values=(1, 5)
    ).as_dict()
    assert got == {**expected, "num_queries": 8}

    with pytest.raises(UserFacingError, match="already has tag v1.0.0"):
        publish_metric(MetricPublishConfig("tester/odmap", "v1.0.0", module_dir=MODULES / "odmap"))


def test_repo_name_must_match_the_module_file(local_hub):
    with pytest.raises(UserFacingError, match=r"fetches odmap-metric.py.*found \[.*'odmap.py'"):
        publish_metric(MetricPublishConfig("tester/odmap-metric", "v1.0.0", module_dir=MODULES / "odmap"))


def _space(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize(
    "files, message",
    [
        # evaluate downloads only what the main file imports: a helper's own helper would be missing.
        (
            {"m.py": "from .a import x\n", "a.py": "from .b import y\nx = y\n", "b.py": "y = 1\n"},
            r"a.py:1 imports .b, which m.py does not import.*add `from .b import ...` to m.py",
        ),
        ({"m.py": "from .a import x\n"}, r"m.py:1 imports .a, but .*a.py does not exist"),
        ({"m.py": "def f():\n    from .a import x\n", "a.py": "x = 1\n"}, "imports .a inside a function"),
        ({"m.py": "from ..pkg import x\n"}, r"only `from .helper import name` works"),
    ],
)
def test_space_must_be_self_contained(tmp_path, files, message):
    with pytest.raises(UserFacingError, match=message):
        space_files(_space(tmp_path / "m", files), "m")


def test_space_files_are_main_helpers_and_docs_without_package_markers(tmp_path):
    folder = _space(
        tmp_path / "m",
        {
            "m.py": "from .a import x\nfrom .shared import z\n",
            "a.py": "from .shared import z\nx = z\n",
            "shared.py": "z = 3\n",
            "__init__.py": "",
            "stray.py": "",
            "README.md": CARD,
            "requirements.txt": "numpy\n",
            ".env": "HF_TOKEN=x\n",
        },
    )
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    names = [p.name for p in space_files(folder, "m")]
    assert names == ["m.py", "a.py", "shared.py", "README.md", "requirements.txt"]


def test_a_published_space_holds_its_helpers_and_computes(local_hub, tmp_path):
    folder = _space(tmp_path / "answer", {"answer.py": ANSWER_MODULE, "shared.py": "VALUE = 41 + 1\n"})
    publish_metric(MetricPublishConfig("tester/answer", "v1.0.0", module_dir=folder))
    remote = hf_hub_download("tester/answer", "shared.py", repo_type="space", revision="v1.0.0")
    assert Path(remote).read_bytes() == (folder / "shared.py").read_bytes()
    assert evaluate.load("tester/answer", revision="v1.0.0").compute(predictions=[1], references=[1]) == {"answer": 42}


CARD = "---\ntitle: m\nsdk: gradio\nsdk_version: 3.50.2\napp_file: app.py\n---\n# card\n"


@pytest.mark.parametrize(
    "card, lacks",
    [
        ("# card without front matter\n", "sdk: gradio, sdk_version: <gradio version>, app_file: app.py"),
        ("---\ntitle: m\ntags:\n- metric\n---\n", "sdk: gradio, sdk_version"),
        ("---\nsdk: streamlit\nsdk_version: 1.0\napp_file: app.py\n---\n", "sdk: gradio"),
        ("---\nsdk: gradio\nsdk_version: 3.50.2\napp_file: main.py\n---\n", "app_file: app.py"),
    ],
)
def test_a_card_that_does_not_declare_the_app_is_refused_before_anything_is_sent(
    local_hub, tmp_path, card, lacks, capsys
):
    """The upload replaces the card `create_repo(space_sdk="gradio")` wrote: without sdk,
    sdk_version and app_file, the Space on the Hub has no app to build."""
    folder = _space(tmp_path / "answer", {"answer.py": ANSWER_MODULE, "shared.py": "VALUE = 42\n", "README.md": card})
    assert cli_main(["publish-metric", str(folder), "--repo-id", "cardless/answer", "--version", "v1.0.0"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{folder / 'README.md'}: the front matter lacks {lacks}" in err, err
    assert not HfApi().repo_exists("cardless/answer", repo_type="space")


def test_the_spaces_cards_declare_the_app_the_publish_uploads(local_hub, tmp_path):
    """As evaluate's metric Spaces: sdk gradio, its version and app.py, which the Space holds."""
    for name in ("odmap", "map_at_r", "itm_score_deltas"):
        publish_metric(MetricPublishConfig(f"cards/{name}", "v1.0.0", module_dir=MODULES / name))
        files = {f.path for f in HfApi().list_repo_tree(f"cards/{name}", repo_type="space", revision="v1.0.0")}
        card = Path(
            hf_hub_download(f"cards/{name}", "README.md", repo_type="space", revision="v1.0.0", cache_dir=tmp_path)
        ).read_text()
        meta = yaml.safe_load(card.split("\n---", 1)[0].removeprefix("---\n"))
        assert meta["sdk"] == "gradio" and meta["sdk_version"] and meta["app_file"] in files
        assert {"evaluate", "metric"} <= set(meta["tags"])
        app = Path(
            hf_hub_download(f"cards/{name}", "app.py", repo_type="space", revision="v1.0.0", cache_dir=tmp_path)
        ).read_text()
        assert "launch_gradio_widget(module)" in app and f'"{name}.py"' in app
        assert "counterfactory" not in app


@pytest.mark.parametrize("linked", ["shared.py", "README.md", "answer.py"])
def test_a_symlink_in_a_space_is_refused_before_anything_is_read_or_sent(local_hub, tmp_path, linked, capsys):
    """A link could send any file of this machine (a helper or README pointing at a secret)."""
    secret = tmp_path / "secret.py"
    secret.write_text("VALUE = 'TOP-SECRET'\n")
    folder = _space(
        tmp_path / "answer", {"answer.py": ANSWER_MODULE, "shared.py": "VALUE = 42\n", "README.md": "card"}
    )
    (folder / linked).unlink()
    (folder / linked).symlink_to(secret)
    repo = f"refused-{linked.split('.')[0]}/answer"  # NAME must be the module's
    assert cli_main(["publish-metric", str(folder), "--repo-id", repo, "--version", "v1.0.0"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{linked}: a symlink" in err and "TOP-SECRET" not in err
    assert not HfApi().repo_exists(repo, repo_type="space")


ANSWER_MODULE = """import datasets
import evaluate

from .shared import VALUE


class Answer(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(description="d", citation="c", inputs_description="i",
                                   features=datasets.Features({"predictions": datasets.Value("int64"),
                                                               "references": datasets.Value("int64")}))

    def _compute(self, predictions, references):
        return {"answer": VALUE}
"""


def test_publish_metric_errors_are_one_line(monkeypatch, capsys):
    """Bad repo id and an unreachable --endpoint: one line each, no traceback (like `publish`)."""
    import os

    from builders.devtools.local_hub import free_port

    monkeypatch.setenv("HF_ENDPOINT", os.environ.get("HF_ENDPOINT", ""))
    assert cli_main(["publish-metric", str(MODULES / "odmap"), "--repo-id", "odmap", "--version", "v1.0.0"]) == 2
    err = capsys.readouterr().err
    assert "must be ORG/NAME" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

    nowhere = f"http://127.0.0.1:{free_port()}"
    assert (
        cli_main(
            [
                "publish-metric",
                str(MODULES / "odmap"),
                "--repo-id",
                "tester/odmap",
                "--version",
                "v1.0.0",
                "--endpoint",
                nowhere,
                "--timeout",
                "2",
            ]
        )
        == 2
    )
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("counterfactory: error:")]
    assert len(lines) == 1 and f"cannot reach the Hub at {nowhere}" in lines[0], lines


@pytest.mark.e2e
def test_publish_metric_with_endpoint_flag_alone(tmp_path):
    """`publish-metric --endpoint URL` with no HF_ENDPOINT / HF_HUB_DISABLE_XET in the environment."""
    import os
    import subprocess
    import sys

    from builders.devtools.local_hub import LocalHub

    hub = LocalHub().start()
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("HF_ENDPOINT", "HF_HUB_DISABLE_XET")}
        cli = Path(sys.executable).parent / "counterfactory"
        done = subprocess.run(
            [
                str(cli),
                "publish-metric",
                str(MODULES / "itm_score_deltas"),
                "--repo-id",
                "tester/itm_score_deltas",
                "--version",
                "v1.0.0",
                "--endpoint",
                hub.url,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        tags = [
            t.name for t in HfApi(endpoint=hub.url).list_repo_refs("tester/itm_score_deltas", repo_type="space").tags
        ]
        assert tags == ["v1.0.0"]
    finally:
        hub.stop()
