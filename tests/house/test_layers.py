"""The project's layers import only downward (and dataset packages never import each other).

Declared once, bottom to top. A module may import its own layer and any layer below it; every
import counts, including the ones inside functions (they run too). The metric Spaces are the
bottom: each is self-contained so `evaluate.load` can run it where counterfactory is not installed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: Bottom to top. A layer is a list of module prefixes; an import resolves to the first match.
LAYERS: list[tuple[str, list[str]]] = [
    ("metrics", ["counterfactory_metrics", "evaluate_modules"]),
    ("engine", ["builders.engine", "builders"]),  # `builders` itself: only `__version__`
    ("readers", ["loading_scripts"]),
    ("models", ["builders.models"]),
    ("viewer", ["builders.viewer"]),
    ("publishing", ["builders.publishing"]),
    ("launch", ["builders.launch"]),
    (
        "datasets",
        ["builders.coco_captions", "builders.counterfactuals", "builders.decorrelation", "builders.eccv_positives"],
    ),
    ("training", ["training"]),
    ("devtools", ["builders.devtools"]),
    ("app", ["builders.app"]),
]
#: Packages of one layer that are peers: none may import another.
PEERS = {"datasets"}
SOURCES = ["builders", "loading_scripts", "training", "evaluate_modules"]


def _owner(module: str) -> tuple[int, str] | None:
    """(layer index, matched prefix) of `module`, the longest prefix winning."""
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[1])):
                best = (index, prefix)
    return best


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] == "evaluate_modules":
        parts[0] = "counterfactory_metrics"
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
            # `from builders import launch` imports the module builders.launch
            found += [
                (node.lineno, f"{name}.{alias.name}")
                for alias in node.names
                if _owner(f"{name}.{alias.name}") and _owner(f"{name}.{alias.name}") != _owner(name)
            ]
    return found


def file_violations(path: Path, module: str) -> list[str]:
    """Imports of `path` (importable as `module`) that point up, or sideways between peers."""
    mine = _owner(module)
    assert mine is not None, f"{module} is in no layer: add its package to LAYERS"
    problems = []
    for line, target in _imports(path, module):
        theirs = _owner(target)
        if theirs is None:
            continue  # a third-party or standard library module
        where = f"{module}:{line} imports {target}"
        if theirs[0] > mine[0]:
            problems.append(f"{where} ({LAYERS[theirs[0]][0]} is above {LAYERS[mine[0]][0]})")
        elif theirs[0] == mine[0] and LAYERS[mine[0]][0] in PEERS and theirs[1] != mine[1]:
            problems.append(f"{where} (peer packages of {LAYERS[mine[0]][0]})")
    return problems


def test_every_import_points_down():
    problems = [
        p
        for root in SOURCES
        for path in sorted((REPO / root).rglob("*.py"))
        for p in file_violations(path, _module_name(path))
    ]
    assert problems == []


@pytest.mark.parametrize(
    "module, target, expected",
    [
        ("builders.engine.x", "builders.app.cli", "above"),
        ("builders.decorrelation.x", "builders.counterfactuals.images", "peer"),
        ("builders.viewer.x", "builders.publishing.card", "above"),
        ("loading_scripts.x", "training.trainer", "above"),
    ],
)
def test_the_check_catches_an_upward_or_sideways_import(tmp_path, module, target, expected):
    """The same check, run on a planted module, reports it (so an empty list means something)."""
    planted = tmp_path / "x.py"
    planted.write_text(f"def f():\n    import {target}\n")
    problems = file_violations(planted, module)
    assert len(problems) == 1 and target in problems[0] and expected in problems[0], problems


def test_a_relative_import_is_resolved_before_it_is_checked(tmp_path):
    planted = tmp_path / "x.py"
    planted.write_text("from ..app import cli\n")
    assert file_violations(planted, "builders.engine.x") != []
    planted.write_text("from .errors import UserFacingError\n")
    assert file_violations(planted, "builders.engine.x") == []
