"""`make test` on a fresh machine installs what its tests need outside Python (Chromium and
chromedriver, for the gallery browser test) and says so; an equipped machine, or a second
`make test`, installs nothing and prints nothing about it; `.ci/run` is just `make test`, and
`make test` runs the lint gate (`make lint`) before anything is installed or tested.

The machine is simulated: PATH holds only stubs (no chromium, an `apt-get` that records its
arguments and "installs" stub browsers, `sudo`, `id`), so nothing is really installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO_ROOT / ".ci" / "bootstrap.sh"
INSTALL = "apt-get install -y -q chromium chromium-driver"

APT_GET = f"""#!/bin/sh
echo "apt-get $* DEBIAN_FRONTEND=$DEBIAN_FRONTEND" >> "$CALLS"
if [ "$1" = install ]; then
    for tool in chromium chromedriver; do
        printf '#!/bin/sh\\n' > "$STUBS/$tool"; {shutil.which("chmod")} +x "$STUBS/$tool"
    done
fi
"""
SUDO = """#!/bin/sh
echo "sudo $*" >> "$CALLS"
exec "$@"
"""
ID = """#!/bin/sh
echo "$STUB_UID"
"""
#: Stands in for .venv/bin/python: records that pytest (or pip) ran.
PYTHON = """#!/bin/sh
echo "python $*" >> "$CALLS"
"""


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def machine(tmp_path):
    """A stub PATH (no chromium) and the file the stubs record their calls in."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for tool in ("bash", "env", "make", "dirname"):  # the real tools the scripts run
        (stubs / tool).symlink_to(shutil.which(tool))
    for name, text in (("apt-get", APT_GET), ("sudo", SUDO), ("id", ID)):
        _script(stubs / name, text)
    calls = tmp_path / "calls.log"
    env = {"PATH": str(stubs), "CALLS": str(calls), "STUBS": str(stubs), "STUB_UID": "0", "HOME": str(tmp_path)}
    return stubs, calls, env


#: What `make test` runs once the machine is equipped: the lint gate (seconds, so first: ruff's
#: rules, then the formatting), then the suite on two workers, file by file.
LINT = "python -m ruff check ."
FORMAT = "python -m ruff format --check ."
PYTEST = "python -m pytest -n 2 --dist loadfile --durations=25"


def _calls(calls: Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


def _bootstrap(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("bash"), str(BOOTSTRAP)], env=env, capture_output=True, text=True, timeout=60)


def _stub_clone(tmp_path: Path, python: str) -> Path:
    """A clone holding the make/CI entry points, whose installed .venv python is the `python` stub."""
    clone = tmp_path / "clone"
    (clone / ".ci").mkdir(parents=True)
    for name in ("Makefile", "pyproject.toml", ".ci/bootstrap.sh", ".ci/run"):
        shutil.copy2(REPO_ROOT / name, clone / name)
    venv_bin = clone / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    _script(venv_bin / "python", python)
    stamp = clone / ".venv" / ".counterfactory-installed"
    stamp.touch()
    os.utime(stamp, (os.path.getmtime(clone / "pyproject.toml") + 10,) * 2)  # installed already
    return clone


def test_make_test_installs_the_browser_once_and_says_so(machine, tmp_path):
    stubs, calls, env = machine
    clone = _stub_clone(tmp_path, PYTHON)

    first = subprocess.run(
        [shutil.which("make"), "test"], cwd=clone, env=env, capture_output=True, text=True, timeout=120
    )
    assert first.returncode == 0, first.stdout + first.stderr
    assert "installing chromium chromium-driver" in first.stderr
    assert _calls(calls) == [
        LINT,
        FORMAT,
        "apt-get update -q DEBIAN_FRONTEND=noninteractive",
        f"{INSTALL} DEBIAN_FRONTEND=noninteractive",
        PYTEST,
    ]

    calls.unlink()
    # CI's entry point is the same command, and on the now equipped machine it installs nothing.
    again = subprocess.run(
        [shutil.which("bash"), str(clone / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert _calls(calls) == [LINT, FORMAT, PYTEST]
    assert "install" not in again.stdout + again.stderr


def test_not_root_installs_through_sudo(machine):
    _, calls, env = machine
    proc = _bootstrap({**env, "STUB_UID": "1000"})
    assert proc.returncode == 0, proc.stderr
    assert _calls(calls) == [
        "sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q",
        "apt-get update -q DEBIAN_FRONTEND=noninteractive",
        "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver",
        f"{INSTALL} DEBIAN_FRONTEND=noninteractive",
    ]


def test_an_equipped_machine_installs_and_prints_nothing(machine):
    stubs, calls, env = machine
    for tool in ("chromium", "chromedriver"):
        _script(stubs / tool, "#!/bin/sh\n")
    proc = _bootstrap(env)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    assert _calls(calls) == []


@pytest.mark.parametrize("missing, says", [("sudo", "not root and no sudo"), ("apt-get", "no apt-get here")])
def test_no_way_to_install_is_one_clear_line(machine, missing, says):
    stubs, calls, env = machine
    (stubs / missing).unlink()
    proc = _bootstrap({**env, "STUB_UID": "1000"})
    assert proc.returncode == 1
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert not any(line.startswith("apt-get") for line in _calls(calls))


def test_a_lint_finding_stops_make_test_before_anything_is_installed_or_run(machine, tmp_path):
    _, calls, env = machine
    # ruff exits 1 when it finds something; the stub does so for the lint call only.
    clone = _stub_clone(tmp_path, PYTHON + 'if [ "$2" = ruff ]; then exit 1; fi\n')

    proc = subprocess.run(
        [shutil.which("bash"), str(clone / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert _calls(calls) == [LINT]
