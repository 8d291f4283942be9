"""The lint gate's configuration (pyproject.toml's [tool.ruff]) finds what it is there for: a
`zip()` without `strict=` (two sequences that must be parallel, silently truncated when one is
shorter) and pyflakes' unused names; it passes the same code once `strict=` is said."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _ruff(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--output-format",
            "concise",
            "--config",
            str(REPO_ROOT / "pyproject.toml"),
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_gate_finds_an_unchecked_zip_and_an_unused_import(tmp_path):
    source = tmp_path / "pairs.py"
    source.write_text("import os\n\n\ndef pairs(ids, scores):\n    return list(zip(ids, scores))\n")
    found = _ruff(source)
    assert found.returncode == 1, found.stdout + found.stderr
    assert "pairs.py:1:8: F401" in found.stdout and "pairs.py:5:17: B905" in found.stdout

    source.write_text("def pairs(ids, scores):\n    return list(zip(ids, scores, strict=True))\n")
    clean = _ruff(source)
    assert clean.returncode == 0, clean.stdout + clean.stderr


def test_the_format_gate_finds_unformatted_code_and_passes_it_formatted(tmp_path):
    source = tmp_path / "pairs.py"
    source.write_text("def pairs(ids,scores):\n    return list(zip(ids,scores,strict=True))\n")
    config = ["--config", str(REPO_ROOT / "pyproject.toml")]
    check = [sys.executable, "-m", "ruff", "format", "--no-cache", "--check", *config, str(source)]
    found = subprocess.run(check, capture_output=True, text=True, timeout=120)
    assert found.returncode == 1 and "pairs.py" in found.stdout, found.stdout + found.stderr
    subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--no-cache", *config, str(source)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert source.read_text() == "def pairs(ids, scores):\n    return list(zip(ids, scores, strict=True))\n"
    clean = subprocess.run(check, capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0, clean.stdout + clean.stderr
