"""The repository layout docs/architecture.md describes stays true: builders/ holds the layer and
dataset packages plus `launch.py`, source files and functions stay small enough to read, the module
map names real paths, every package of builders/ and training/, and the layers bottom to top in the
order tests/house/test_layers.py enforces, and `counterfactory_metrics` is this checkout's
evaluate_modules/."""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILDERS = REPO_ROOT / "builders"
ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
#: Folders whose .py files must stay under MAX_LINES lines.
SOURCE_DIRS = ("builders", "evaluate_modules", "training", "loading_scripts")
MAX_LINES = 500
#: Folders whose functions must stay under MAX_FUNCTION_LINES lines (the metric Spaces are exempt:
#: each is a self-contained file users read as a whole).
FUNCTION_DIRS = ("builders", "training", "loading_scripts")
MAX_FUNCTION_LINES = 60
METRICS = sorted(p.name for p in (REPO_ROOT / "evaluate_modules").iterdir() if (p / f"{p.name}.py").is_file())


def builder_packages() -> list[str]:
    return sorted(p.name for p in BUILDERS.iterdir() if (p / "__init__.py").is_file())


def architecture_rows(page: str) -> list[list[str]]:
    """The backticked paths of each row's first cell, in the first module-map table of `page`."""
    table = re.search(r"^\| module \| role \|\n\|---\|---\|\n((?:\|.*\n?)*)", page, flags=re.M)
    assert table, "docs/architecture.md has no '| module | role |' table"
    cells = re.findall(r"^\| (`[^|]+`) \|", table.group(1), flags=re.M)
    return [re.findall(r"`([^`]+)`", cell) for cell in cells]


def architecture_paths(page: str) -> list[str]:
    return [path for row in architecture_rows(page) for path in row]


def test_the_table_reader_reads_the_module_map():
    page = (
        "# X\n\nprose `not/a/row/`\n\n| module | role |\n|---|---|\n| `builders/a/` | a |\n"
        "| `training/` | t |\n| `builders/b/`, `builders/c.py` | b, c |\n\nprose `not/a/row/`\n\n"
        "| module | role |\n|---|---|\n| `elsewhere/` | no |\n"
    )
    assert architecture_paths(page) == ["builders/a/", "training/", "builders/b/", "builders/c.py"]
    assert architecture_rows(page)[2] == ["builders/b/", "builders/c.py"]


def test_builders_top_level_holds_only_packages_and_the_launcher():
    strays = [
        p.name
        for p in BUILDERS.iterdir()
        if p.name not in ("__init__.py", "launch.py", "__pycache__")
        and not (p.is_dir() and (p / "__init__.py").is_file())
    ]
    assert not strays, f"builders/ may hold only packages and launch.py, found {strays}"
    assert len(builder_packages()) >= 5


def test_no_source_file_is_over_the_line_limit():
    files = [p for folder in SOURCE_DIRS for p in (REPO_ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts]
    assert len(files) > 50, "the scan found suspiciously few source files"
    long = [
        f"{p.relative_to(REPO_ROOT)}: {n} lines"
        for p in files
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]
    assert not long, f"split these files (limit {MAX_LINES} lines):\n" + "\n".join(long)


def long_functions(source: str, name: str) -> list[str]:
    """`name:line function (N lines)` for every function of `source` over MAX_FUNCTION_LINES."""
    return [
        f"{name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_no_function_is_over_the_line_limit():
    files = [p for folder in FUNCTION_DIRS for p in (REPO_ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts]
    long = [f for p in files for f in long_functions(p.read_text(encoding="utf-8"), str(p.relative_to(REPO_ROOT)))]
    assert not long, f"split these functions (limit {MAX_FUNCTION_LINES} lines):\n" + "\n".join(long)


def test_the_function_check_counts_a_long_function():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def short():\n    pass\n\n\ndef f():\n{body}", "m.py") == [
        f"m.py:5 f ({MAX_FUNCTION_LINES + 1} lines)"
    ]


def test_architecture_table_paths_exist_and_name_every_builders_package():
    paths = architecture_paths(ARCHITECTURE.read_text(encoding="utf-8"))
    assert len(paths) >= 10, f"the module map lists suspiciously few paths: {paths}"
    missing = [p for p in paths if not (REPO_ROOT / p).exists()]
    assert not missing, f"docs/architecture.md's module map names paths that do not exist: {missing}"
    listed = {p.rstrip("/") for p in paths}
    unlisted = [name for name in builder_packages() if f"builders/{name}" not in listed]
    assert not unlisted, f"builders/ packages missing from docs/architecture.md's module map: {unlisted}"
    training = [str(p.parent.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "training").rglob("__init__.py")]
    assert "training/report" in training
    unlisted = sorted(set(training) - listed)
    assert not unlisted, f"training/ packages missing from docs/architecture.md's module map: {unlisted}"


@cache
def layers_module():
    """tests/house/test_layers.py (wherever under tests/ it lives), the order the map must follow."""
    found = sorted((REPO_ROOT / "tests").rglob("test_layers.py"))
    assert len(found) == 1, found
    spec = importlib.util.spec_from_file_location("layers_under_test", found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def layer_of(path: str) -> int:
    """The index, bottom to top, of the tests/house/test_layers.py layer that holds `path`."""
    parts = path.rstrip("/").removesuffix(".py").split("/")
    if parts[0] == "evaluate_modules":
        parts[0] = "counterfactory_metrics"
    owner = layers_module()._owner(".".join(parts))
    assert owner is not None, f"{path} is in no layer of tests/house/test_layers.py"
    return owner[0]


def test_architecture_table_lists_the_layers_bottom_to_top():
    """Each layer imports only the layers below it: the map lists them in test_layers' order,
    bottom first, every layer in it, and no row mixes two layers."""
    rows = [[layer_of(p) for p in row] for row in architecture_rows(ARCHITECTURE.read_text(encoding="utf-8"))]
    mixed = [row for row in rows if len(set(row)) > 1]
    assert not mixed, f"a row of docs/architecture.md's module map spans layers: {mixed}"
    order = [row[0] for row in rows]
    assert order == sorted(order), f"the module map is not bottom to top: layers {order}"
    assert set(order) == set(range(len(layers_module().LAYERS))), f"layers missing from the map: {order}"


def test_the_layer_order_check_catches_a_map_top_down():
    assert layer_of("builders/app/") > layer_of("training/report/") > layer_of("builders/engine/")
    assert layer_of("evaluate_modules/") == 0 and layer_of("builders/launch.py") > layer_of("builders/models/")


@pytest.mark.parametrize("name", METRICS)
def test_counterfactory_metrics_is_this_checkouts_evaluate_modules(name):
    spec = importlib.util.find_spec(f"counterfactory_metrics.{name}")
    assert spec is not None and spec.submodule_search_locations is not None
    locations = [Path(p).resolve() for p in spec.submodule_search_locations]
    assert locations == [REPO_ROOT / "evaluate_modules" / name], (
        f"counterfactory_metrics.{name} resolves to {locations}; reinstall the project "
        "(pip install -e .) from this checkout"
    )
    module = importlib.util.find_spec(f"counterfactory_metrics.{name}.{name}")
    assert Path(module.origin).resolve() == REPO_ROOT / "evaluate_modules" / name / f"{name}.py"


def test_every_metric_space_is_checked():
    assert METRICS == ["itm_score_deltas", "map_at_r", "odmap"]
