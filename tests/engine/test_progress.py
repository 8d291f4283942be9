"""Progress inside a part: a tqdm bar on a terminal, periodic log lines otherwise, each naming
the items done of the total, the rate and the stage the builder reported."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path
import pytest

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

CLI = Path(sys.executable).parent / "counterfactory"


def _build_argv(coco: Path, out: Path) -> list[str]:
    # One part holds every item, so only in-part progress can show anything before the end.
    return [
        str(CLI),
        "build",
        "coco-captions",
        "--coco-root",
        str(coco),
        "--splits",
        "test",
        "val",
        "train",
        "--output",
        str(out),
        "--part-size",
        "1000",
    ]


def test_log_lines_when_not_a_terminal(coco_fixture_dir, tmp_path):
    env = {**os.environ, "COUNTERFACTORY_PROGRESS_INTERVAL": "0"}  # a line per update
    proc = subprocess.run(_build_argv(coco_fixture_dir, tmp_path / "out"), env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = re.findall(
        r"counterfactory\.progress: \[rank 0/1\]: images; (\d+)/(\d+) items, "
        r"[\d.]+ items/s, ETA (?:\d\d:\d\d:\d\d|unknown)",
        proc.stderr,
    )
    done = [int(d) for d, _ in lines]
    total = {int(t) for _, t in lines}
    assert len(total) == 1 and done == sorted(done) and len(done) >= 3
    assert done[-1] == total.pop()  # the last in-part update counts every item
    assert "\r" not in proc.stderr.split("counterfactory.progress")[1]  # no bar in a log file


def test_bar_on_a_terminal(coco_fixture_dir, tmp_path):
    controller, terminal = pty.openpty()
    # A fresh pty is 0 columns wide; a terminal window is not.
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    proc = subprocess.Popen(
        _build_argv(coco_fixture_dir, tmp_path / "out"),
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
        close_fds=True,
    )
    os.close(terminal)
    chunks = []
    while True:
        try:
            data = os.read(controller, 65536)
        except OSError:  # EIO: the build closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(controller)
    assert proc.wait() == 0
    screen = b"".join(chunks).decode(errors="replace")
    n = int(re.search(r"(\d+) items in 1 parts", screen).group(1))
    # tqdm's bar: "[rank 0/1]: 100%|####| N/N [elapsed<eta, rate, stage]"
    assert re.search(
        rf"\[rank 0/1\]: 100%\|.*\| {n}/{n} \[[\d:]+<[\d:]+, +[\d.]+(?:item/s|s/item), images\]", screen
    ), screen[-1500:]
    assert "counterfactory.progress" not in screen  # the bar replaces the periodic lines
