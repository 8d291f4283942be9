"""The three metric Spaces, published to the local Hub, load in a clean virtualenv and reproduce
the checkout's numbers; the published files are the repository's files, byte for byte.

The clean virtualenv holds only what the Spaces' requirements.txt declare plus `evaluate` and the
gradio their cards declare (for the Space apps, tests/metrics/test_metric_space_apps.py), installed from
the package registry (never counterfactory, never torch). It is built once and kept under the
project's git-ignored `.cache/`, keyed by a hash of the requirements, so reruns reuse it. Scripts run
there with a working directory outside the checkout, so the project's packages cannot leak in.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import evaluate
import numpy as np
import pytest
import yaml
from huggingface_hub import HfApi, hf_hub_download

from builders.app.cli import main as cli_main
from builders.publishing.metric import space_files

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

REPO_ROOT = Path(__file__).resolve().parents[2]
SPACES = REPO_ROOT / "evaluate_modules"
NAMES = ("map_at_r", "odmap", "itm_score_deltas")
ORG = "clean"
VERSION = "v1.0.0"
DOWNLOAD_COMMAND = "python -m nltk.downloader averaged_perceptron_tagger_eng"


def card_metadata(name: str) -> dict:
    """The YAML front matter of the Space's README.md (what the Hub reads to build it)."""
    text = (SPACES / name / "README.md").read_text()
    return yaml.safe_load(text.split("\n---", 1)[0].removeprefix("---\n"))


def _requirements() -> list[str]:
    """The Spaces' requirements, evaluate, and the gradio their cards declare (what the Hub
    installs to run app.py) with its client (gradio pins the client's version exactly)."""
    lines = {
        line.strip()
        for name in NAMES
        for line in (SPACES / name / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    (sdk_version,) = {str(card_metadata(name)["sdk_version"]) for name in NAMES}
    return sorted(lines | {f"evaluate=={evaluate.__version__}", f"gradio=={sdk_version}", "gradio_client"})


@pytest.fixture(scope="session")
def clean_python() -> Path:
    """The interpreter of the cached clean virtualenv (created on first use, ~1 minute)."""
    requirements = _requirements()
    key = hashlib.sha256("\n".join([sys.version, *requirements]).encode()).hexdigest()[:16]
    venv = REPO_ROOT / ".cache" / f"clean-venv-{key}"
    python = venv / "bin" / "python"
    stamp = venv / "installed.txt"
    if not stamp.is_file():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
            check=True,
            timeout=1800,
        )
        stamp.write_text("\n".join(requirements) + "\n")
    return python


@pytest.fixture(scope="session")
def published(local_hub) -> dict[str, str]:
    repos = {}
    for name in NAMES:
        repo_id = f"{ORG}/{name}"
        assert cli_main(["publish-metric", str(SPACES / name), "--repo-id", repo_id, "--version", VERSION]) == 0
        repos[name] = repo_id
    return repos


# The script run inside the clean venv: loads each Space by tag, runs the cases, prints JSON.
# NLTK searches only NLTK_DATA: a tagger in ~/nltk_data or a system-wide folder such as
# /usr/share/nltk_data is never found, so "no tagger" means none, on any machine.
RUNNER = textwrap.dedent("""
    import json, os, sys
    import nltk
    nltk.data.path[:] = [p for p in os.environ["NLTK_DATA"].split(os.pathsep) if p]
    import numpy as np
    import evaluate

    cases = json.load(open(sys.argv[1]))
    out = []
    for case in cases:
        kwargs = dict(case["kwargs"])
        for key in case.get("arrays", []):
            kwargs[key] = np.asarray(kwargs[key])
        for key in case.get("id_dicts", []):  # JSON object keys are strings
            kwargs[key] = {int(q): ids for q, ids in kwargs[key].items()}
        metric = evaluate.load(case["repo_id"], revision=case["revision"])
        try:
            out.append({"result": metric.compute(**kwargs)})
        except Exception as err:
            out.append({"error": type(err).__name__, "message": str(err)})
    print(json.dumps(out))
""")


def _cases(seed: int = 0) -> list[dict]:
    """Docstring examples and seeded random inputs for each Space (JSON-able kwargs)."""
    rng = np.random.default_rng(seed)
    cases = [
        (
            "map_at_r",
            {
                "predictions": [[10, 99, 11, 12], [99, 10, 11, 12]],
                "references": [[10, 11, 12], [10, 11, 12]],
                "k_values": [1, 2],
            },
            [],
        ),
        (
            "map_at_r",
            {"similarity": [[0.9, 0.1, 0.9], [0.2, 0.8, 0.3]], "positives": [[2], [1, 2]], "k_values": [1]},
            ["similarity"],
        ),
        (
            "map_at_r",
            {
                "predictions": [rng.permutation(200)[:20].tolist() for _ in range(50)],
                "references": [rng.choice(200, int(rng.integers(1, 15)), replace=False).tolist() for _ in range(50)],
                "k_values": [1, 5, 10],
            },
            [],
        ),
        (
            "map_at_r",
            {
                "similarity": rng.integers(0, 6, (40, 120)).astype(float).tolist(),
                "positives": [rng.choice(120, 4, replace=False).tolist() for _ in range(40)],
                "k_values": [1, 5],
            },
            ["similarity"],
        ),
        (
            "odmap",
            {
                "retrieved": [[1, 2], [2, 0]],
                "removed_classes": [["cat"], ["cat"]],
                "present_classes": [["dog"], ["dog"]],
                "mention_matrix": [[True, False], [False, True], [True, True]],
                "class_names": ["cat", "dog"],
                "k_values": [1, 2],
            },
            ["mention_matrix"],
        ),
        (
            "odmap",
            {
                "retrieved": [rng.permutation(300)[:10].tolist() for _ in range(60)],
                "removed_classes": [["cat"], ["person", "car"]] * 30,
                "present_classes": [["dog", "car"], ["dog"]] * 30,
                "mention_matrix": (rng.random((300, 4)) < 0.3).tolist(),
                "class_names": ["cat", "dog", "person", "car"],
            },
            ["mention_matrix"],
        ),
        (
            "itm_score_deltas",
            {
                "g_cr_ir": [0.9, 0.8],
                "g_cr_io": [0.1, 0.2],
                "g_co_ir": [0.3, 0.9],
                "g_cc_ics": [0.5, 0.4],
                "g_cc_ios": [0.6, 0.1],
                "g_co_ics": [0.2, 0.5],
            },
            [],
        ),
        (
            "itm_score_deltas",
            {
                name: rng.normal(size=37).tolist()
                for name in ("g_cr_ir", "g_cr_io", "g_co_ir", "g_cc_ics", "g_cc_ios", "g_co_ics")
            },
            [],
        ),
    ]
    return [{"name": n, "kwargs": kw, "arrays": arrays} for n, kw, arrays in cases]


TEXT_CASE = {
    "name": "odmap",
    "arrays": [],
    "kwargs": {
        "retrieved": [["a dog on the grass", "a man with a dog"], ["a man with a dog", "a dog on the grass"]],
        "removed_classes": [["person"], ["person"]],
        "present_classes": [["dog"], ["dog"]],
        "k_values": [1, 2],
    },
}


def _run_clean(python: Path, cases: list[dict], repos: dict[str, str], tmp_path: Path, nltk_data: Path) -> list[dict]:
    for case in cases:
        case.update(repo_id=repos[case["name"]], revision=VERSION)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    (tmp_path / "runner.py").write_text(RUNNER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(
        HF_MODULES_CACHE=str(tmp_path / "modules"), HF_METRICS_CACHE=str(tmp_path / "m"), NLTK_DATA=str(nltk_data)
    )
    proc = subprocess.run(
        [str(python), "runner.py", "cases.json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _in_process(case: dict):
    kwargs = dict(case["kwargs"])
    for key in case["arrays"]:
        kwargs[key] = np.asarray(kwargs[key])
    for key in case.get("id_dicts", []):
        kwargs[key] = {int(q): ids for q, ids in kwargs[key].items()}
    return json.loads(json.dumps(evaluate.load(str(SPACES / case["name"])).compute(**kwargs)))


def _eccv_case(seed: int = 1) -> dict:
    """The ECCV Caption suite from seeded rankings over the real COCO 5K test ids (the
    annotations come from eccv_caption inside the clean venv)."""
    from counterfactory_metrics.map_at_r.eccv_suite import EccvAnnotations

    ann = EccvAnnotations.load()
    rng = np.random.default_rng(seed)
    galleries = {"i2t": ann.coco_test_ids, "t2i": np.asarray(list(ann.coco.i2t))}
    rankings = {}
    for modality, gallery in galleries.items():
        ranked = {}
        for query in getattr(ann.coco, modality):
            positives = set()
            for source in (ann.eccv, ann.coco, ann.cxc):
                positives.update(int(p) for p in getattr(source, modality).get(query, ()))
            hits = [p for p in positives if rng.random() < 0.6]
            filler = rng.choice(gallery, 60, replace=False).tolist()
            ranked[str(query)] = list(dict.fromkeys(hits + filler))[:60]
        rankings[f"{modality}_rankings"] = ranked
    targets = ["eccv_map_at_r", "eccv_rprecision", "eccv_r1", "coco_5k_recalls", "cxc_r1"]
    return {
        "name": "map_at_r",
        "arrays": [],
        "id_dicts": list(rankings),
        "kwargs": {**rankings, "target_metrics": targets},
    }


def test_clean_venv_has_no_project_and_no_torch(clean_python, tmp_path):
    probe = (
        "import importlib.util as u; "
        "print([m for m in ('torch', 'builders', 'evaluate_modules', 'counterfactory') "
        "if u.find_spec(m)])"
    )
    proc = subprocess.run([str(clean_python), "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_spaces_reproduce_the_checkout_numbers_in_a_clean_venv(clean_python, published, tmp_path, nltk_data_dir):
    cases = [*_cases(), _eccv_case()]
    got = _run_clean(clean_python, [dict(c) for c in cases], published, tmp_path, tmp_path / "none")
    for case, out in zip(cases, got, strict=True):
        assert "result" in out, (case["name"], out)
        assert out["result"] == _in_process(case), case["name"]
    # The docstring examples' printed values, as the module docs state them.
    assert {k: round(v, 4) for k, v in got[0]["result"].items()} == {
        "map_at_r": 0.4722,
        "r_precision": 0.6667,
        "recall_at_1": 0.5,
        "recall_at_2": 1.0,
        "num_queries": 2,
    }
    assert got[4]["result"] == {"ODmAP@1": 0.5, "ODmAP@2": 0.25, "num_queries": 2}


def test_text_mode_odmap_needs_the_tagger_and_then_matches(clean_python, published, tmp_path, nltk_data_dir):
    empty = tmp_path / "no_nltk_data"
    empty.mkdir()
    (missing,) = _run_clean(clean_python, [dict(TEXT_CASE)], published, tmp_path / "a", empty)
    assert missing.get("error") == "TaggerDataMissing", missing
    assert DOWNLOAD_COMMAND in missing["message"]
    (ok,) = _run_clean(clean_python, [dict(TEXT_CASE)], published, tmp_path / "b", nltk_data_dir)
    assert ok["result"] == _in_process(TEXT_CASE)


@pytest.mark.parametrize("name", NAMES)
def test_published_files_are_the_repository_files(published, name, tmp_path):
    repo_id = published[name]
    tree = {f.path for f in HfApi().list_repo_tree(repo_id, repo_type="space", revision=VERSION)}
    files = space_files(SPACES / name, name)
    # .gitattributes comes with every new Hub repo; app.py is the standard evaluate widget.
    assert tree - {".gitattributes"} == {p.name for p in files} | {"app.py"}
    for path in files:
        remote = hf_hub_download(repo_id, path.name, repo_type="space", revision=VERSION, cache_dir=tmp_path)
        assert Path(remote).read_bytes() == path.read_bytes(), path
