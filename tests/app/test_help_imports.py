"""`--help` is instant: no command's help imports a heavy library.

Each `--help` runs in a fresh interpreter with `PYTHONPROFILEIMPORTTIME=1` (Python's own import
trace, written to stderr), and the trace must name none of the heavy libraries below. The
top-level help runs through the installed `counterfactory` script; the subcommands through
`builders.app.cli.main` in `python -c` (same parser, one interpreter each).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from builders.app.cli import build_parser

CLI = Path(sys.executable).parent / "counterfactory"
#: What made every command take 17-50 s (7 s of CPU) before the first line of help.
HEAVY = (
    "torch",
    "datasets",
    "transformers",
    "diffusers",
    "nltk",
    "open_clip",
    "accelerate",
    "huggingface_hub",
    "evaluate",
    "sentence_transformers",
    "pandas",
    "pyarrow",
)


def _command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,)
                yield from _command_paths(sub, prefix + (name,))


def _imported_heavy(stderr: str) -> set[str]:
    # Trace lines look like "import time:   123 |   456 |   torch.nn"; keep the top-level package.
    names = {m.group(1).split(".")[0] for m in re.finditer(r"^import time:.*\|\s*([\w.]+)\s*$", stderr, re.M)}
    return names & set(HEAVY)


def _help_trace(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    return subprocess.run(argv, env=env, capture_output=True, text=True)


@pytest.mark.e2e
def test_top_level_help_imports_no_heavy_library():
    proc = _help_trace([str(CLI), "--help"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "build" in proc.stdout
    assert "import time:" in proc.stderr  # the trace really ran
    assert _imported_heavy(proc.stderr) == set()


@pytest.mark.e2e
@pytest.mark.parametrize("path", sorted(_command_paths(build_parser())), ids=" ".join)
def test_every_subcommand_help_imports_no_heavy_library(path):
    code = "import sys; from builders.app.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = _help_trace([sys.executable, "-c", code, *path, "--help"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:")
    assert _imported_heavy(proc.stderr) == set(), f"counterfactory {' '.join(path)} --help"


def test_every_builder_is_covered():
    from builders.app.registry import BUILDER_MODULES

    paths = set(_command_paths(build_parser()))
    assert {("build", name) for name in BUILDER_MODULES} <= paths
