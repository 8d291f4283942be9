"""The repository layout the README's "## Architecture" section describes stays true: builders/
holds the layer and dataset packages plus `launch.py`, source files and functions stay small enough
to read, the module map
names real paths and every builders/ package, and `counterfactory_metrics` is this checkout's
evaluate_modules/."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILDERS = REPO_ROOT / "builders"
#: Folders whose .py files must stay under MAX_LINES lines.
SOURCE_DIRS = ("builders", "evaluate_modules", "training", "loading_scripts")
MAX_LINES = 500
#: Folders whose functions must stay under MAX_FUNCTION_LINES lines (the metric Spaces are exempt:
#: each is a self-contained file users read as a whole).
FUNCTION_DIRS = ("builders", "training", "loading_scripts")
MAX_FUNCTION_LINES = 80
METRICS = sorted(p.name for p in (REPO_ROOT / "evaluate_modules").iterdir()
                 if (p / f"{p.name}.py").is_file())


def builder_packages() -> list[str]:
    return sorted(p.name for p in BUILDERS.iterdir() if (p / "__init__.py").is_file())


def architecture_paths(readme: str) -> list[str]:
    """The backticked paths in the first cells of the module-map table under "## Architecture"."""
    section = re.search(r"^## Architecture\n(.*?)(?=^## |\Z)", readme, flags=re.M | re.S)
    assert section, "README.md has no '## Architecture' section"
    cells = re.findall(r"^\| (`[^|]+`) \|", section.group(1), flags=re.M)
    return [path for cell in cells for path in re.findall(r"`([^`]+)`", cell)]


def test_the_table_reader_reads_the_module_map():
    readme = ("# X\n\n## Architecture\n\n| module | role |\n|---|---|\n| `builders/a/` | a |\n"
              "| `training/` | t |\n| `builders/b/`, `builders/c.py` | b, c |\n\nprose `not/a/row/`\n\n## Next\n\n| `elsewhere/` | no |\n")
    assert architecture_paths(readme) == ["builders/a/", "training/", "builders/b/", "builders/c.py"]


def test_builders_top_level_holds_only_packages_and_the_launcher():
    strays = [p.name for p in BUILDERS.iterdir()
              if p.name not in ("__init__.py", "launch.py", "__pycache__")
              and not (p.is_dir() and (p / "__init__.py").is_file())]
    assert not strays, f"builders/ may hold only packages and launch.py, found {strays}"
    assert len(builder_packages()) >= 5


def test_no_source_file_is_over_the_line_limit():
    files = [p for folder in SOURCE_DIRS for p in (REPO_ROOT / folder).rglob("*.py")
             if "__pycache__" not in p.parts]
    assert len(files) > 50, "the scan found suspiciously few source files"
    long = [f"{p.relative_to(REPO_ROOT)}: {n} lines" for p in files
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert not long, f"split these files (limit {MAX_LINES} lines):\n" + "\n".join(long)


def long_functions(source: str, name: str) -> list[str]:
    """`name:line function (N lines)` for every function of `source` over MAX_FUNCTION_LINES."""
    return [f"{name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_function_is_over_the_line_limit():
    files = [p for folder in FUNCTION_DIRS for p in (REPO_ROOT / folder).rglob("*.py")
             if "__pycache__" not in p.parts]
    long = [f for p in files for f in long_functions(p.read_text(encoding="utf-8"),
                                                     str(p.relative_to(REPO_ROOT)))]
    assert not long, f"split these functions (limit {MAX_FUNCTION_LINES} lines):\n" + "\n".join(long)


def test_the_function_check_counts_a_long_function():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def short():\n    pass\n\n\ndef f():\n{body}", "m.py") == [
        f"m.py:5 f ({MAX_FUNCTION_LINES + 1} lines)"]


def test_architecture_table_paths_exist_and_name_every_builders_package():
    paths = architecture_paths((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(paths) >= 10, f"the module map lists suspiciously few paths: {paths}"
    missing = [p for p in paths if not (REPO_ROOT / p).exists()]
    assert not missing, f"the README's module map names paths that do not exist: {missing}"
    listed = {p.rstrip("/") for p in paths}
    unlisted = [name for name in builder_packages() if f"builders/{name}" not in listed]
    assert not unlisted, f"builders/ packages missing from the README's module map: {unlisted}"


@pytest.mark.parametrize("name", METRICS)
def test_counterfactory_metrics_is_this_checkouts_evaluate_modules(name):
    spec = importlib.util.find_spec(f"counterfactory_metrics.{name}")
    assert spec is not None and spec.submodule_search_locations is not None
    locations = [Path(p).resolve() for p in spec.submodule_search_locations]
    assert locations == [REPO_ROOT / "evaluate_modules" / name], (
        f"counterfactory_metrics.{name} resolves to {locations}; reinstall the project "
        "(pip install -e .) from this checkout")
    module = importlib.util.find_spec(f"counterfactory_metrics.{name}.{name}")
    assert Path(module.origin).resolve() == REPO_ROOT / "evaluate_modules" / name / f"{name}.py"


def test_every_metric_space_is_checked():
    assert METRICS == ["itm_score_deltas", "map_at_r", "odmap"]
