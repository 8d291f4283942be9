"""The package list in pyproject.toml is explicit (the metric folder is mapped to another import
name); every folder that is a Python package must be in it, or a wheel install would miss it."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_in_pyproject():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folder_of = {name: folder for name, folder in setuptools["package-dir"].items()}
    listed = set(setuptools["packages"])
    # A mapped folder is a package by the mapping (evaluate_modules/ is a namespace, no __init__).
    found = {alias for alias, folder in folder_of.items() if (REPO / folder).is_dir()}
    for top in ("builders", "loading_scripts", "dataset_cards", "training", "evaluate_modules"):
        for init in (REPO / top).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO).parts
            name = ".".join(rel)
            for alias, folder in folder_of.items():
                if rel[0] == folder:
                    name = ".".join((alias, *rel[1:]))
            found.add(name)
    assert found - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - found == set(), "these listed packages have no folder"
    assert not (REPO / "evaluate_modules" / "__init__.py").exists(), (
        "evaluate_modules/ must not be importable under its own name (it shadows evaluate's package)"
    )
