"""No two modules that import each other, even for a type, and the layers point one way.

The graph is read from the source with `ast`: every import counts, at module level, inside a
function or under `if TYPE_CHECKING:`. A circle of imports means neither module can be read (or
loaded) without the other; it usually marks a job split across two modules, or one that belongs
in a third both can use. The layer rule: shared/ imports neither
worker/ nor receiver/, receiver/ imports no worker module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("receiver", "worker", "shared")
# Layer -> the layers it must not import.
FORBIDDEN = {"shared": ("worker", "receiver"), "receiver": ("worker",)}

Graph = dict[str, set[str]]


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(node: ast.AST, name: str, is_package: bool) -> Iterator[str]:
    """The dotted names one import statement of module `name` refers to: `from a import b`
    yields `a.b`, which `_resolve` finds to be the module `a.b` or a name in the module `a`."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = name.split(".") if is_package else name.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, *([base] if base else [])])
        yield from (base if alias.name == "*" else f"{base}.{alias.name}" for alias in node.names)


def _resolve(dotted: str, modules: set[str]) -> str | None:
    """The longest module of ours that `dotted` names or lies in; None for outside code."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_graph(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> Graph:
    """Module -> the modules of ours it imports, anywhere in its source."""
    paths = {
        module_name(p, root): p for package in packages for p in (root / package).rglob("*.py")
    }
    modules = set(paths)
    graph: Graph = {}
    for name, path in paths.items():
        edges: set[str] = set()
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for dotted in _imported(node, name, is_package):
                target = _resolve(dotted, modules)
                if target is not None and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """One circle of imports per group of modules that reach each other, as a path that
    ends where it begins (Tarjan's strongly connected components, then a walk inside one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_circle(graph, group) for group in groups]


def _circle(graph: Graph, group: set[str]) -> list[str]:
    """A shortest path from the group's first module back to itself, through the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & group):
                if target == start:
                    return [*paths[node], start]
                if target not in paths:
                    paths[target] = [*paths[node], target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no circle in {sorted(group)}")


def layer_breaches(graph: Graph) -> list[str]:
    return sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if target.split(".")[0] in FORBIDDEN.get(module.split(".")[0], ())
    )


def test_the_graph_sees_the_packages() -> None:
    graph = import_graph()
    assert len(graph) > 30
    assert "worker.turn.turn" in graph["worker.process"]


def test_no_module_imports_itself_in_a_circle() -> None:
    found = [" -> ".join(circle) for circle in cycles(import_graph())]
    assert not found, "modules that import each other:\n" + "\n".join(found)


def test_the_layers_point_one_way() -> None:
    breaches = layer_breaches(import_graph())
    assert not breaches, "imports against the layers:\n" + "\n".join(breaches)


def test_a_circle_is_found_and_named(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\n"
    )
    (package / "c.py").write_text("def f():\n    from . import a\n")
    (package / "d.py").write_text("import pkg.a\n")
    assert cycles(import_graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_a_layer_breach_is_found(tmp_path: Path) -> None:
    for package, source in (("shared", "import worker.x\n"), ("worker", "")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "x.py").write_text(source)
    graph = import_graph(tmp_path, ("shared", "worker"))
    assert layer_breaches(graph) == ["shared.x imports worker.x"]
