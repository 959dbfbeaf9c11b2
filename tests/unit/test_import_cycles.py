"""The package's dependencies point one way: no two of its packages (or top-level modules)
import each other, directly or around a circle, and no module imports one that imports it
back. Read from the source (every import, in functions too), so a new cycle fails here."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "fsm_celery"


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if "migrations" in parts:
            continue  # alembic's scripts, loaded by alembic
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                yield whole if whole in modules else base


Graph = dict[str, set[str]]


def _graph(unit: Callable[[str], str]) -> Graph:
    """Who imports whom, between units (packages, or modules)."""
    modules = _modules()
    graph: Graph = {}
    for name, path in modules.items():
        for target in _imports(name, path, modules):
            if target in modules and unit(target) != unit(name):
                graph.setdefault(unit(name), set()).add(unit(target))
    return graph


def _package(module: str) -> str:
    """The top-level package or module of fsm_celery a module belongs to."""
    return ".".join(module.split(".")[:2])


def _cycle(graph: Graph) -> list[str]:
    """A circle of imports, or []."""
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        return list(exc.args[1])
    return []


def _reach(graph: Graph, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_no_two_packages_import_each_other() -> None:
    assert _cycle(_graph(_package)) == []


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert _cycle(_graph(lambda module: module)) == []


def test_the_engine_and_the_core_import_no_adapter() -> None:
    graph = _graph(_package)
    adapters = {"fsm_celery.acks", "fsm_celery.channel", "fsm_celery.worker", "fsm_celery.wiring"}
    assert adapters.isdisjoint(_reach(graph, "fsm_celery.engine"))
    assert adapters.isdisjoint(_reach(graph, "fsm_celery.core"))
