"""The test session never reads the user's home folder, caches or NLTK data (conftest.py): a
user who followed the README (`counterfactory nltk offline-tagger` into ~/nltk_data, models in
~/.cache/huggingface, a matplotlibrc) gets the same test results as a fresh machine. Only the
user's pip and git settings are kept, so installing and `git` work as they do for the user."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builders.engine.nltk_setup import TAGGER_DIR

TESTS = Path(__file__).resolve().parents[1]

#: Run in a fresh interpreter whose HOME is a planted "real" home: set up as the test session is
#: (conftest imported first), then report what the session and a subprocess of it would read.
PROBE = """
import json, os, shutil, subprocess, sys
sys.path.insert(0, sys.argv[1])
import conftest  # the session set-up, before any library below is imported
from pathlib import Path
import huggingface_hub.constants, matplotlib, nltk, torch.hub
child = subprocess.run([sys.executable, "-c", "import json, nltk; print(json.dumps(nltk.data.path))"],
                       capture_output=True, text=True, check=True)
try:
    tagger = str(nltk.data.find(sys.argv[2] + "/"))
except LookupError:
    tagger = None
print(json.dumps({"home": str(Path.home()), "nltk": nltk.data.path,
                  "nltk_subprocess": json.loads(child.stdout), "tagger": tagger,
                  "hf_hub_cache": huggingface_hub.constants.HF_HUB_CACHE,
                  "torch_hub": torch.hub.get_dir(), "mpl_config": matplotlib.get_configdir(),
                  "env": dict(os.environ)}))
shutil.rmtree(conftest._SESSION_TMP)
"""


def _inside(path: str | Path, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder.resolve())


def test_the_session_runs_in_a_temporary_home(session_tmp, real_home, tmp_path_factory):
    import huggingface_hub.constants
    import matplotlib
    import nltk
    import torch.hub

    assert Path.home() != real_home and _inside(Path.home(), session_tmp)
    for path in (
        huggingface_hub.constants.HF_HUB_CACHE,
        torch.hub.get_dir(),
        matplotlib.get_configdir(),
        *(os.environ[v] for v in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME")),
    ):
        assert _inside(path, session_tmp), path
    # NLTK searches the project's own data first, and otherwise only folders of this session
    # (a test may add its own); never ~/nltk_data or the system-wide folders.
    project_data = Path(os.environ["NLTK_DATA"])
    assert nltk.data.path[0] == str(project_data)
    allowed = (project_data, session_tmp, tmp_path_factory.getbasetemp())
    assert all(any(_inside(p, a) for a in allowed) for p in nltk.data.path), nltk.data.path


@pytest.mark.slow
def test_a_tagger_and_caches_in_the_users_home_are_never_read(tmp_path):
    home = tmp_path / "home"
    tagger = home / "nltk_data" / TAGGER_DIR
    tagger.mkdir(parents=True)
    (tagger / "averaged_perceptron_tagger_eng.weights.json").write_text("{}")
    (home / ".cache" / "huggingface" / "hub").mkdir(parents=True)
    (home / ".config" / "matplotlib").mkdir(parents=True)
    (home / ".config" / "matplotlib" / "matplotlibrc").write_text("figure.dpi: 7\n")
    pip_conf = home / ".config" / "pip" / "pip.conf"
    pip_conf.parent.mkdir(parents=True)
    pip_conf.write_text("[global]\n")
    (home / ".gitconfig").write_text("[user]\n\tname = someone\n")
    # A user's shell as it may be: HOME, NLTK and Hugging Face settings of their own.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("XDG_", "HF_", "NLTK", "PIP_CONFIG", "GIT_CONFIG", "MPL", "TORCH"))
    }
    env.update(
        HOME=str(home), HF_HUB_CACHE=str(home / ".cache" / "huggingface" / "hub"), NLTK_DATA=str(home / "nltk_data")
    )
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(TESTS), TAGGER_DIR],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not _inside(seen["home"], home)
    for key in ("nltk", "nltk_subprocess"):
        assert not [p for p in seen[key] if _inside(p, home)], (key, seen[key])
    assert seen["tagger"] is None or not _inside(seen["tagger"], home)
    for key in ("hf_hub_cache", "torch_hub", "mpl_config"):
        assert not _inside(seen[key], home), (key, seen[key])
    kept = {"PIP_CONFIG_FILE": str(pip_conf), "GIT_CONFIG_GLOBAL": str(home / ".gitconfig")}
    assert {k: seen["env"].get(k) for k in kept} == kept, "pip and git keep the user's settings"
    leaks = {k: v for k, v in seen["env"].items() if str(home) in v and k not in kept}
    assert not leaks, leaks
