"""Tether's modules import one another without a circle: dependencies point one way
(docs/architecture.md). Every import counts, also one deferred into a function body or
guarded by TYPE_CHECKING, because each hides a circle rather than removing it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[1] / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "tether").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets.update(known(f"{base}.{alias.name}") for alias in node.names)
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for dep in sorted(graph[node]):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_of_tether_imports_itself_through_another() -> None:
    graph = _import_graph(_modules())
    assert "tether.runtimes.hermes.streaming" in graph["tether.runtimes.hermes.runtime"]
    assert _circles(graph) == []


def test_the_circle_finder_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]


# What each layer may import besides itself (docs/architecture.md, "Layout"): http -> services
# -> runs -> sessions -> log; projections depend only on events (and the one rule for visible
# names, tether/visible_text.py, which depends on nothing).
MAY_IMPORT = {
    "tether.events": set(),
    "tether.errors": set(),
    "tether.visible_text": set(),
    "tether.projections": {"tether.events", "tether.visible_text"},
    "tether.log": {"tether.events", "tether.errors"},
    "tether.sessions": {
        "tether.events",
        "tether.errors",
        "tether.log",
        "tether.projections",
        "tether.visible_text",
    },
}
# The composition: only the command line, the HTTP layer and each other import these.
TOP = ("tether.cli", "tether.http", "tether.services")


def _layer(module: str) -> str:
    return next((k for k in MAY_IMPORT if module == k or module.startswith(k + ".")), module)


def test_dependencies_point_one_way() -> None:
    wrong = []
    for module, deps in _import_graph(_modules()).items():
        layer = _layer(module)
        for dep in deps:
            below_its_layer = layer in MAY_IMPORT and _layer(dep) not in MAY_IMPORT[layer] | {layer}
            upward = dep.startswith(TOP) and not module.startswith((*TOP, "tether.__main__"))
            if below_its_layer or upward:
                wrong.append(f"{module} -> {dep}")
    assert wrong == []
