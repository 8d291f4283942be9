"""Every shell command of the README and of docs/ runs as written and exits 0.

The commands are read from the pages themselves, so the two cannot drift: every ```bash block of
README.md but its set-up block (`make demo`, `make test`: `make test` runs this suite, and
test_demo runs the demo), then every ```bash block of the docs/ pages in DOCS_IN_ORDER (each page
starts from what the pages before it wrote; a docs page with commands that is not in that list
fails the test). A command (or a block of one construct) that the README and a page both hold runs
once, where it first appears, so the README adds only its own commands to the run. A template that
needs the user's own files (real models, a cluster, an annotation export) is fenced as ```text and
says so. They run as one bash script would (`set -e`: the first failing command fails the test,
`-x` names it), each command in its own bash process under its own time limit (exported variables
carried to the next), so a slow machine stretches no single limit over all of them, in
a scratch folder laid out like the repository root (symlinks to its folders; `data/` and `out/`
are real), with `.venv/bin` on the PATH, HOME in the scratch folder and no NLTK_DATA (so
`counterfactory nltk offline-tagger` must install where NLTK looks by default), and the Hub
endpoint pointed at the test's local Hub where the real-Hub examples publish.

The local-Hub session of docs/publishing.md (the block that starts `counterfactory local-hub`)
runs as a fresh shell would: without HF_ENDPOINT, HF_HUB_DISABLE_XET and HF_TOKEN, so
`--endpoint` alone must be enough to publish and the block itself must set what `load_dataset` and
`evaluate.load` need. It runs on a free port instead of the page's, so concurrent test runs never
collide.

The builds they write are then checked as data: cards and manifests name no local directory of
the machine that built them, and the manifest records the git commit of the code.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from builders.devtools.local_hub import free_port

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
#: The docs pages whose ```bash blocks run, in this order, after the README's.
DOCS_IN_ORDER = (
    "setup.md",
    "building.md",
    "datasets.md",
    "publishing.md",
    "gallery.md",
    "training.md",
    "report.md",
    "production.md",
)
#: The README's set-up block, the one README block that does not run here.
SETUP_COMMANDS = ["make demo", "make test"]
#: Written by the commands themselves; everything else of the repository root is linked.
_SCRATCH_OWN = {"data", "out"}
#: The port of the local-Hub session, replaced by a free one when the test runs it.
README_HUB_PORT = "18765"
#: What a fresh shell does not have; the local-Hub session must work without it.
HUB_CLIENT_ENV = ("HF_ENDPOINT", "HF_HUB_DISABLE_XET", "HF_TOKEN")
# The fixture's commands are limited one by one (UNIT_TIMEOUT_S), not all under one test limit.
# End to end (tests/README.md).
pytestmark = [pytest.mark.timeout(0), pytest.mark.e2e]


def bash_blocks(text: str) -> list[str]:
    """The ```bash blocks of a markdown page, in order."""
    return re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S)


def page_blocks(name: str) -> list[str]:
    """The ```bash blocks of docs/NAME."""
    blocks = bash_blocks((DOCS / name).read_text(encoding="utf-8"))
    assert blocks, f"no ```bash block in docs/{name}"
    return blocks


def readme_blocks(readme: str) -> list[str]:
    """The README's ```bash blocks but its set-up block (there must be exactly one)."""
    blocks = bash_blocks(readme)
    setup = [b for b in blocks if [normalized(c) for c in commands_of(b)] == SETUP_COMMANDS]
    assert len(setup) == 1, f"{len(setup)} README blocks are the set-up block {SETUP_COMMANDS}"
    rest = [b for b in blocks if b is not setup[0]]
    assert rest, "the README has no command besides the set-up block"
    return rest


def docs_with_commands() -> set[str]:
    """The docs/ pages that hold a ```bash block."""
    return {p.name for p in DOCS.glob("*.md") if bash_blocks(p.read_text(encoding="utf-8"))}


def page_blocks_in_order() -> list[str]:
    return [b for name in DOCS_IN_ORDER for b in page_blocks(name)]


def local_hub_block() -> str:
    """The local-Hub session (the one block of the README and docs/ that starts `local-hub`)."""
    every = readme_blocks((REPO / "README.md").read_text(encoding="utf-8")) + page_blocks_in_order()
    found = [b for b in every if "counterfactory local-hub" in b]
    assert len(found) == 1, f"{len(found)} blocks start `counterfactory local-hub`"
    assert f"--port {README_HUB_PORT}" in found[0], f"the session no longer uses port {README_HUB_PORT}"
    return found[0]


def as_fresh_shell(block: str, port: int) -> str:
    """`block` on `port`, in a subshell without the Hub client environment."""
    return f"(\nunset {' '.join(HUB_CLIENT_ENV)}\n{block.replace(README_HUB_PORT, str(port))})\n"


def runnable_blocks(readme: str, hub_port: int) -> list[str]:
    """The README's blocks, then those of the DOCS_IN_ORDER pages (see the module doc)."""
    session = local_hub_block()
    return [as_fresh_shell(b, hub_port) if b == session else b for b in readme_blocks(readme) + page_blocks_in_order()]


def normalized(command: str) -> str:
    """A command as it runs: without its trailing comment, whitespace collapsed."""
    return " ".join(re.sub(r"(^|\s)#\s.*$", "", command, flags=re.M).split())


def run_once(units: list[str]) -> list[str]:
    """`units` with each command (or block) that repeats an earlier one left out."""
    seen: set[str] = set()
    kept = []
    for unit in units:
        if (key := normalized(unit)) not in seen:
            seen.add(key)
            kept.append(unit)
    return kept


@dataclass
class ScriptRun:
    """The units' exit status (the first failing one's, or 0), and their output together."""

    returncode: int
    stdout: str
    stderr: str


def run_units(units: list[str], cwd: Path, env: dict[str, str]) -> ScriptRun:
    """Run `units` in turn, each `bash -e -x` with the variables the earlier ones exported; stop
    at the first that fails or passes UNIT_TIMEOUT_S (its process group killed)."""
    state = cwd / ".readme-exports"
    out, err = [], []
    for unit in units:
        body = f"[ ! -f {state} ] || source {state}\n{unit}\nexport -p > {state}\n"
        proc = subprocess.Popen(
            ["bash", "-e", "-x", "-c", body],
            cwd=cwd,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=UNIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            stderr += f"\n+ {unit.strip()}\nREADME command ran past {UNIT_TIMEOUT_S} s\n"
            proc.returncode = 124
        out.append(stdout)
        err.append(stderr)
        if proc.returncode != 0:
            return ScriptRun(proc.returncode, "".join(out), "".join(err))
    return ScriptRun(0, "".join(out), "".join(err))


#: A shell construct that spans lines: its block runs as one unit.
_MULTILINE = re.compile(r"^\s*(\(|for\b|if\b|while\b|until\b|case\b)|<<|\{\s*$", re.M)
#: Seconds one unit (a command, or a block of one construct) may take.
UNIT_TIMEOUT_S = 900


def script_units(script_blocks: list[str]) -> list[str]:
    """The blocks as units that run in turn: each command of a block, or a whole block that holds
    a construct spanning lines (the local-Hub session's subshell, a heredoc)."""
    return [u for b in script_blocks for u in ([b] if _MULTILINE.search(b) else commands_of(b))]


def commands_of(script: str) -> list[str]:
    """One line per command (continuation lines joined), comments and blank lines dropped."""
    return [
        line
        for line in re.sub(r"\\\n", " ", script).splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _build_dirs(script: str, cwd: Path) -> list[Path]:
    builds = [
        c for c in commands_of(script) if re.match(r"\s*(counterfactory build|accelerate launch .*builders/)", c)
    ]
    return [cwd / out for c in builds for out in re.findall(r"--output\s+(\S+)", c)]


def wait_until_closed(port: int, seconds: float = 15.0) -> bool:
    """True once nothing listens on 127.0.0.1:port (a killed server takes a moment to go)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return True
        time.sleep(0.2)
    return False


def command_env(scratch: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NLTK_DATA"}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", HOME=str(scratch / "home"), **extra)
    return env


@pytest.fixture(scope="module")
def readme_run(local_hub, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("readme")
    for entry in REPO.iterdir():
        if not entry.name.startswith(".") and entry.name not in _SCRATCH_OWN:
            (scratch / entry.name).symlink_to(entry)
    hub_port = free_port()
    blocks = runnable_blocks((REPO / "README.md").read_text(encoding="utf-8"), hub_port)
    # Interval 0: every stage change logs a line, so the progress check below does not depend
    # on how fast the machine runs the builds.
    env = command_env(scratch, HF_ENDPOINT=local_hub.url, COUNTERFACTORY_PROGRESS_INTERVAL="0")
    proc = run_units(run_once(script_units(blocks)), scratch, env)
    return scratch, "\n".join(blocks), proc, hub_port


def test_readme_commands_run_as_written(readme_run):
    scratch, script, proc, _ = readme_run
    traced = [line for line in proc.stderr.splitlines() if line.startswith("+ ")]
    assert proc.returncode == 0, f"README/docs command failed: {traced[-1] if traced else '?'}\n" + proc.stderr[-4000:]
    commands = commands_of(script)
    assert len(commands) >= 8
    assert sum(c.lstrip().startswith("counterfactory build") for c in commands) >= 5
    for out in _build_dirs(script, scratch):
        manifest = json.loads((out / "build_manifest.json").read_text())
        assert sum(o["rows"] for o in manifest["outputs"].values()) > 0, out
    # The README's five: a build, published, a metric computed, a model finetuned on the build and
    # reported beside the two tiny CLIPs.
    assert "published my-org/coco-captions@v1.0.0" in proc.stdout
    assert "'map_at_r': 1.0" in proc.stdout, proc.stdout[-2000:]
    records = [json.loads(line) for line in (scratch / "runs/first-report/results.jsonl").read_text().splitlines()]
    models = {r["model"] for r in records}
    assert len(models) == 3 and any(m.startswith("local:final@sha256:") for m in models), models
    # The Training commands wrote their results; the counterfactual-only evaluation has the
    # ITM deltas of its pairs (IR_c, TR_c) and trained nothing.
    for run in ("first", "decorrelation", "decorrelation-2p", "baseline", "cf-deltas"):
        assert (scratch / "runs" / run / "metrics.md").is_file(), run
    final = json.loads((scratch / "runs/cf-deltas/run.json").read_text())["final_metrics"]
    assert {"itm/IR_c_mean", "itm/TR_c_mean"} <= set(final), sorted(final)
    # The COCO-Counterfactuals comparison: the real-only baseline sweep (--mix cf:real trains on
    # real rows only) and cf:medium tested against it.
    for seed in (107, 108):
        base = json.loads((scratch / f"runs/real-only/seed-{seed}/run.json").read_text())
        assert set(base["train_examples"]) == {"real"}, base["train_examples"]
    medium = json.loads((scratch / "runs/medium/summary.json").read_text())
    assert len(medium["baseline_runs"]) == 2 and any("p_value" in r for r in medium["metrics"])
    # The progress of a build names its stage inside a part (periodic lines: not a terminal).
    assert re.search(r"counterfactory\.progress: .*candidates \d+/\d+; \d+/\d+ items", proc.stderr)


def test_cards_and_manifests_name_no_local_directory(readme_run, real_home):
    scratch, script, proc, _ = readme_run
    assert proc.returncode == 0
    local = {
        str(scratch),
        str(scratch.resolve()),
        str(REPO),
        str(Path.home()),
        str(real_home),
        tempfile.gettempdir(),
        os.path.realpath(tempfile.gettempdir()),
    }
    builds = _build_dirs(script, scratch)
    assert builds
    for out in builds:
        for name in ("README.md", "build_manifest.json"):
            text = (out / name).read_text()
            leaks = sorted(d for d in local if d in text)
            assert not leaks, f"{out.name}/{name} names {leaks}"


def test_manifest_records_the_code_commit(readme_run):
    scratch, script, proc, _ = readme_run
    assert proc.returncode == 0
    for out in _build_dirs(script, scratch):
        git = json.loads((out / "build_manifest.json").read_text())["counterfactory_git"]
        assert re.fullmatch(r"[0-9a-f]{40}", git["commit"]) and isinstance(git["dirty"], bool), out
        # The commit the code was at (HEAD, or an ancestor of it if someone committed meanwhile).
        ancestor = subprocess.run(["git", "-C", str(REPO), "merge-base", "--is-ancestor", git["commit"], "HEAD"])
        assert ancestor.returncode == 0, (out, git)


def test_cards_describe_only_the_configs_a_build_has(readme_run):
    scratch, script, proc, _ = readme_run
    assert proc.returncode == 0
    for out in _build_dirs(script, scratch):
        manifest = json.loads((out / "build_manifest.json").read_text())
        configs = {o["config"] for o in manifest["outputs"].values() if o["rows"]}
        card = (out / "README.md").read_text()
        named = set(re.findall(r"`(\w+)`\s+config\b", card))
        assert named <= configs, f"{out.name}: the card describes configs {sorted(named - configs)}"


def test_the_local_hub_session_needs_only_endpoint_and_its_own_exports(readme_run, local_hub):
    scratch, script, proc, hub_port = readme_run
    assert proc.returncode == 0
    block = local_hub_block()
    # Both publishes run before the block sets any client variable: `--endpoint` alone suffices.
    assert block.index("export HF_ENDPOINT") > block.rindex("--endpoint http://127.0.0.1:")
    assert "published my-org/decorrelation@v1.0.0" in proc.stdout
    assert "published my-org/odmap@v1.0.0" in proc.stdout
    # load_dataset read back every row of the build; the metric loaded from its tag computes.
    rows = json.loads((scratch / "out/decorrelation/build_manifest.json").read_text())["outputs"]
    assert re.search(rf"train: Dataset\(\{{.*?num_rows: {rows['default/train']['rows']}\n", proc.stdout, re.S), (
        proc.stdout[-2000:]
    )
    assert "{'ODmAP@1': 1.0, 'num_queries': 1}" in proc.stdout
    # It published to its own server on its own port, not to the Hub the rest of the README uses.
    from huggingface_hub import HfApi

    api = HfApi(endpoint=local_hub.url)
    assert api.repo_exists("my-org/coco-counterfactuals", repo_type="dataset")
    assert not api.repo_exists("my-org/decorrelation", repo_type="dataset")
    assert f"127.0.0.1:{hub_port}" in proc.stderr and wait_until_closed(hub_port)


def test_the_local_hub_session_stops_its_server_when_a_command_fails(tmp_path):
    """Without the builds it publishes, the session's first publish fails: the trap still stops
    the server it started (and the failure reaches the caller)."""
    (tmp_path / "out").mkdir()
    (tmp_path / "evaluate_modules").symlink_to(REPO / "evaluate_modules")
    port = free_port()
    env = {k: v for k, v in command_env(tmp_path).items() if k not in HUB_CLIENT_ENV}
    block = local_hub_block()
    proc = subprocess.run(
        ["bash", "-c", block.replace(README_HUB_PORT, str(port))],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "out/decorrelation" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"local Hub on http://127.0.0.1:{port}" in (tmp_path / "out/local-hub.log").read_text()
    assert wait_until_closed(port), f"the local Hub still listens on {port} after the failure"


def test_seeing_the_data_writes_the_galleries_it_names(readme_run):
    scratch, script, proc, _ = readme_run
    assert proc.returncode == 0
    shows = [
        c for c in commands_of("\n".join(page_blocks("gallery.md"))) if c.lstrip().startswith("counterfactory show")
    ]
    assert len(shows) >= 2
    galleries = [scratch / re.search(r"--output\s+(\S+)", c).group(1) for c in shows]
    for gallery in galleries:
        summary = json.loads((gallery / "gallery.json").read_text())
        assert summary["complete"] and summary["rows"] > 0 and (gallery / "index.html").is_file()
    # The published version shows exactly the rows of the build it was published from.
    build, published = galleries[0], galleries[1]
    assert json.loads((published / "gallery.json").read_text())["source"].endswith("@v1.0.0")
    pages = sorted(p.name for p in (build / "pages").iterdir())
    assert pages and pages == sorted(p.name for p in (published / "pages").iterdir())
    assert all((build / "pages" / n).read_bytes() == (published / "pages" / n).read_bytes() for n in pages)


def test_every_docs_page_with_commands_runs():
    """A page of docs/ with a ```bash block is in DOCS_IN_ORDER (so its commands run), and every
    page there holds one."""
    assert docs_with_commands() == set(DOCS_IN_ORDER)
    assert all(page_blocks(name) for name in DOCS_IN_ORDER)


def test_every_readme_block_but_the_set_up_runs():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme_blocks(readme)) == len(bash_blocks(readme)) - 1
    fake = (
        "# x\n\n```bash\nmake demo   # the demo\nmake test\n```\n\n```text\nnot run\n```\n\n"
        "```bash\ncounterfactory fixture coco data/coco\n```\n"
    )
    assert readme_blocks(fake) == ["counterfactory fixture coco data/coco\n"]
    with pytest.raises(AssertionError, match="set-up block"):
        readme_blocks(fake.replace("make test", "make install"))


def test_a_command_of_the_readme_and_a_page_runs_once():
    units = script_units(
        [
            "counterfactory fixture coco data/coco   # the fixture\n"
            "counterfactory train --real out/a \\\n    --output runs/a\n",
            "# again, as a page says it\ncounterfactory fixture coco data/coco\n"
            "counterfactory  train --real out/a --output runs/a  # same\n"
            "counterfactory train --real out/a --output runs/b\n",
        ]
    )
    assert run_once(units) == [
        "counterfactory fixture coco data/coco   # the fixture",
        "counterfactory train --real out/a      --output runs/a",
        "counterfactory train --real out/a --output runs/b",
    ]
    # The real pages: the README's fixture command, which docs/setup.md repeats, runs once.
    blocks = runnable_blocks((REPO / "README.md").read_text(encoding="utf-8"), free_port())
    every = script_units(blocks)
    fixture = [u for u in every if normalized(u) == "counterfactory fixture coco data/coco --release 2017"]
    assert len(fixture) == 2
    assert [normalized(u) for u in run_once(every)].count(normalized(fixture[0])) == 1
