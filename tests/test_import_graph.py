"""No import cycle among the modules of `controlplane/` and `providers/`, counting every import
statement: at module level, inside functions, and under `if TYPE_CHECKING:` alike."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# source folder -> the name it installs as
PACKAGES = {"controlplane": "controlplane", "providers": "controlplane_providers"}


def modules() -> dict[str, Path]:
    """Every module of the packages, by dotted name (a package is its `__init__.py`)."""
    found: dict[str, Path] = {}
    for folder, name in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [name, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported(module: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """The known modules `module` imports, with the line of each import."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in known:  # from pkg import submodule
                    yield submodule, node.lineno
                elif source in known:
                    yield source, node.lineno


def graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    known = modules()
    edges: dict[str, dict[str, int]] = {m: {} for m in known}
    for module, path in known.items():
        for target, line in imported(module, path, known):
            if target != module:
                edges[module].setdefault(target, line)
    return edges, known


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    return found


def one_circle(component: list[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """A shortest way from the component's first module back to itself, through the component."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in edges[node]:
                if target == start:
                    way = [node]
                    while way[-1] != start:
                        way.append(previous[way[-1]])
                    return [*reversed(way), start]
                if target in members and target not in previous and target != start:
                    previous[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no circle through {start}")


def describe(circle: list[str], edges: dict[str, dict[str, int]], known: dict[str, Path]) -> str:
    steps = [f"  {a} -> {b} ({known[a].relative_to(ROOT)}:{edges[a][b]})" for a, b in pairwise(circle)]
    return "\n".join(steps)


def test_the_graph_sees_imports_of_every_kind() -> None:
    """The walk reads function-level, relative and `from pkg import submodule` imports."""
    edges, known = graph()
    assert len(known) > 100
    assert "controlplane_providers.base" in edges["controlplane_providers.local"]
    assert "controlplane.app" in edges["controlplane.cli"]  # inside a command's function
    assert "controlplane.ops.metrics" in edges["controlplane.app"]  # from controlplane.ops import metrics


def test_no_import_cycle() -> None:
    edges, known = graph()
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n\n".join(
        f"{len(c)} modules: {', '.join(c)}\n{describe(one_circle(c, edges), edges, known)}" for c in found)
