"""Every shell command of the README's "Using it" section runs as written and exits 0.

The commands are read from the README itself (its ```bash blocks between "## Using it" and the
next "## " heading), so the two cannot drift; a template that needs the user's own files (real
models, an annotation export) is fenced as ```text and says so. They run as one bash script (`set -e`: the first
failing command fails the test, `-x` names it) in a scratch folder laid out like the repository
root (symlinks to its folders; `data/` and `out/` are real), with `.venv/bin` on the PATH, HOME in
the scratch folder and no NLTK_DATA (so `counterfactory nltk offline-tagger` must install where
NLTK looks by default), and the Hub endpoint pointed at the local Hub where they publish.

The builds they write are then checked as data: cards and manifests name no local directory of
the machine that built them, and the manifest records the git commit of the code.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Written by the commands themselves; everything else of the repository root is linked.
_SCRATCH_OWN = {"data", "out"}


def readme_commands(readme: str) -> str:
    """The ```bash blocks of the "Using it" section, in order, as one script."""
    start = readme.index("\n## Using it\n")
    end = readme.find("\n## ", start + 1)
    section = readme[start:end if end != -1 else None]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert blocks, "no ```bash block in the README's Using it section"
    return "\n".join(blocks)


def _build_dirs(script: str, cwd: Path) -> list[Path]:
    return [cwd / out for out in re.findall(r"--output\s+(\S+)", script)]


@pytest.fixture(scope="module")
def readme_run(local_hub, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("readme")
    for entry in REPO.iterdir():
        if not entry.name.startswith(".") and entry.name not in _SCRATCH_OWN:
            (scratch / entry.name).symlink_to(entry)
    script = readme_commands((REPO / "README.md").read_text())
    env = {k: v for k, v in os.environ.items() if k != "NLTK_DATA"}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
               HOME=str(scratch / "home"), HF_ENDPOINT=local_hub.url,
               COUNTERFACTORY_PROGRESS_INTERVAL="5")
    proc = subprocess.run(["bash", "-e", "-x", "-c", script], cwd=scratch, env=env,
                          capture_output=True, text=True)
    return scratch, script, proc


def test_readme_commands_run_as_written(readme_run):
    scratch, script, proc = readme_run
    traced = [line for line in proc.stderr.splitlines() if line.startswith("+ ")]
    assert proc.returncode == 0, (f"README command failed: {traced[-1] if traced else '?'}\n"
                                  + proc.stderr[-4000:])
    commands = [line for line in re.sub(r"\\\n", " ", script).splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert len(commands) >= 8
    assert sum(c.lstrip().startswith("counterfactory build") for c in commands) >= 5
    for out in _build_dirs(script, scratch):
        manifest = json.loads((out / "build_manifest.json").read_text())
        assert sum(o["rows"] for o in manifest["outputs"].values()) > 0, out
    # The progress of a build names its stage inside a part (periodic lines: not a terminal).
    assert re.search(r"counterfactory\.progress: .*candidates \d+/\d+; \d+/\d+ items", proc.stderr)


def test_cards_and_manifests_name_no_local_directory(readme_run):
    scratch, script, proc = readme_run
    assert proc.returncode == 0
    local = {str(scratch), str(scratch.resolve()), str(REPO), str(Path.home()),
             tempfile.gettempdir(), os.path.realpath(tempfile.gettempdir())}
    builds = _build_dirs(script, scratch)
    assert builds
    for out in builds:
        for name in ("README.md", "build_manifest.json"):
            text = (out / name).read_text()
            leaks = sorted(d for d in local if d in text)
            assert not leaks, f"{out.name}/{name} names {leaks}"


def test_manifest_records_the_code_commit(readme_run):
    scratch, script, proc = readme_run
    assert proc.returncode == 0
    for out in _build_dirs(script, scratch):
        git = json.loads((out / "build_manifest.json").read_text())["counterfactory_git"]
        assert re.fullmatch(r"[0-9a-f]{40}", git["commit"]) and isinstance(git["dirty"], bool), out
        # The commit the code was at (HEAD, or an ancestor of it if someone committed meanwhile).
        ancestor = subprocess.run(["git", "-C", str(REPO), "merge-base", "--is-ancestor",
                                   git["commit"], "HEAD"])
        assert ancestor.returncode == 0, (out, git)


def test_cards_describe_only_the_configs_a_build_has(readme_run):
    scratch, script, proc = readme_run
    assert proc.returncode == 0
    for out in _build_dirs(script, scratch):
        manifest = json.loads((out / "build_manifest.json").read_text())
        configs = {o["config"] for o in manifest["outputs"].values() if o["rows"]}
        card = (out / "README.md").read_text()
        named = set(re.findall(r"`(\w+)`\s+config\b", card))
        assert named <= configs, f"{out.name}: the card describes configs {sorted(named - configs)}"
