"""The tests are arranged by layer (tests/README.md): every test file sits in the folder of the
layer it tests, none directly in tests/ (a file added there, for instance by a branch written
before the move, is caught here and moved at merge time), and no two test files share a name
(pytest imports each test module by its file name alone)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from test_layers import LAYERS

TESTS = Path(__file__).resolve().parents[1]
#: The layers of tests/house/test_layers.py, plus the repository-wide checks and shared helpers.
FOLDERS = {name for name, _ in LAYERS} | {"house", "helpers"}


def _test_files() -> list[Path]:
    return [p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts]


def test_no_test_file_sits_directly_in_tests():
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, (
        f"test files directly in tests/: {loose}; move each into the folder of the "
        "layer it tests (tests/README.md), e.g. `git mv tests/test_x.py tests/engine/`"
    )


def test_every_test_folder_is_a_layer():
    assert len(_test_files()) > 50, "the scan found suspiciously few test files"
    strays = sorted({p.relative_to(TESTS).parts[0] for p in _test_files() if p.parent != TESTS} - FOLDERS)
    assert not strays, f"test folders that are no layer of tests/house/test_layers.py: {strays}"


def test_test_file_names_are_unique():
    counts = Counter(p.name for p in _test_files())
    assert not [name for name, n in counts.items() if n > 1], (
        f"test file names used twice: {sorted(n for n, c in counts.items() if c > 1)}"
    )
