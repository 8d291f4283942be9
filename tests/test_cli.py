"""The installed `counterfactory` command: every command and subcommand has working --help."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from builders.infra.cli import build_parser

CLI = Path(sys.executable).parent / "counterfactory"


def _subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,)
                yield from _subcommands(sub, prefix + (name,))


def test_help_lists_every_command():
    out = subprocess.run([str(CLI), "--help"], capture_output=True, text=True, check=True).stdout
    top = {path[0] for path in _subcommands(build_parser())}
    expected = {"fixture", "models", "nltk", "build", "publish", "publish-metric", "local-hub"}
    assert expected <= top
    for name in top:
        assert name in out


def test_every_command_has_help():
    paths = list(_subcommands(build_parser()))
    assert len(paths) > 7
    for path in paths:
        try:
            build_parser().parse_args([*path, "--help"])
        except SystemExit as stop:
            assert stop.code == 0, path
        else:  # pragma: no cover - argparse always exits on --help
            raise AssertionError(f"{path} --help did not exit")
