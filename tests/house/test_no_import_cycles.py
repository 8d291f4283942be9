"""No two of the project's modules import each other, directly or round a longer circle.

`tests/house/test_layers.py` keeps imports pointing down between layers; inside one layer (a dataset
package, `training/`) modules could still import each other in a circle, usually by a lazy import
inside a function that hides the circle until that function runs. Every import counts here as it
does there: the ones inside functions too. The graph's strongly connected components are the
circles; each is reported as one round trip with the lines that close it.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

from test_layers import REPO, SOURCES, _module_name


def _targets(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The names an import statement may load: `from a import b` loads `a` and maybe module `a.b`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # resolved as test_layers does: `.x` in package p is p.x
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        name = ".".join(base + ([node.module] if node.module else []))
    else:
        name = node.module or ""
    return [name] + [f"{name}.{alias.name}" for alias in node.names]


def _project_module(name: str, modules: set[str]) -> str | None:
    """The project module that importing `name` runs (its longest prefix that is a module)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def import_graph(files: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {project module it imports: first line that imports it}."""
    modules = set(files)
    graph: dict[str, dict[str, int]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _targets(node, package):
                    target = _project_module(name, modules)
                    if target is not None and target != module:
                        edges[target] = min(edges.get(target, node.lineno), node.lineno)
        graph[module] = edges
    return graph


def _components(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative, so no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def _round_trip(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    """The shortest circle from the component's first module back to it, with each import's line."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node]):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                path.reverse()
                hops = [f"{a}:{graph[a][b]}" for a, b in zip(path, path[1:] + [start], strict=True)]
                return " -> ".join(hops + [start])
            if child in members and child not in came_from and child != start:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"no circle through {start} in {component}")


def import_cycles(graph: dict[str, dict[str, int]]) -> list[str]:
    return [_round_trip(graph, c) for c in _components(graph) if len(c) > 1]


def _project_files() -> dict[str, Path]:
    return {_module_name(path): path for root in SOURCES for path in sorted((REPO / root).rglob("*.py"))}


def test_no_module_imports_itself_round_a_circle():
    cycles = import_cycles(import_graph(_project_files()))
    assert cycles == [], "import circles (each hop: module:line of its import of the next):\n" + "\n".join(cycles)


def test_the_check_finds_a_lazy_circle_and_names_its_lines(tmp_path):
    """Planted: a -> b at import time, b -> c, c -> a inside a function; d only imports a."""
    sources = {
        "pkg.a": "from pkg import b\n",
        "pkg.b": "import pkg.c\n",
        "pkg.c": "def f():\n    from . import a\n",
        "pkg.d": "from pkg.a import thing\n",
    }
    files = {}
    for module, text in sources.items():
        files[module] = tmp_path / f"{module.rpartition('.')[2]}.py"
        files[module].write_text(text)
    assert import_cycles(import_graph(files)) == ["pkg.a:1 -> pkg.b:1 -> pkg.c:2 -> pkg.a"]


def test_a_module_importing_a_name_from_its_own_package_is_no_circle(tmp_path):
    planted = tmp_path / "a.py"
    planted.write_text("from pkg.b import x\n")
    other = tmp_path / "b.py"
    other.write_text("import json\nfrom pkg import c\n")
    assert import_cycles(import_graph({"pkg.a": planted, "pkg.b": other})) == []


def test_the_report_scores_without_a_training_configuration():
    """The model report evaluates with an `EvalConfig` of its own flags: none of its modules
    builds (or imports) the trainer's `TrainConfig` or its sections to stand in for one."""
    training_only = {"TrainConfig", "DataConfig", "OptimConfig", "RunConfig"}
    found = []
    for path in sorted((REPO / "training" / "report").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "training.config":
                found += [
                    f"{path.relative_to(REPO)}:{node.lineno} {a.name}" for a in node.names if a.name in training_only
                ]
    assert found == [], found
