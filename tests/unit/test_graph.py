"""A definition as a graph: every state a node, every edge a link, and DOT text (pure)."""

from __future__ import annotations

import pytest

from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.graph import (
    FAILURE,
    GUARDED,
    LOOP_EXHAUSTED,
    MACHINE,
    MAP,
    PARALLEL,
    SUCCESS,
    TASK,
    graph,
    to_dot,
)
from fsm_celery.core.loader import SHIPPED_DEFINITIONS, definition_files, load_all
from tests.support import FIXTURE_DEFINITIONS

SHIPPED = load_all(definition_files(str(SHIPPED_DEFINITIONS)))


@pytest.mark.parametrize("definition", SHIPPED, ids=lambda d: d.type)
def test_every_state_is_a_node_and_every_edge_a_link(definition: MachineDefinition) -> None:
    g = graph(definition)
    assert [n.id for n in g.nodes] == [s.name for s in definition.states]
    assert [n.id for n in g.nodes if n.initial] == [definition.initial_state]
    edges = {(s.name, e.target) for s in definition.states for e in s.edges}
    assert edges <= {(link.source, link.target) for link in g.links}
    names = {n.id for n in g.nodes}
    assert all(link.source in names and link.target in names for link in g.links)


def test_guards_loops_and_failures_are_told_apart() -> None:
    research = next(d for d in SHIPPED if d.type == "research_pipeline")
    kinds = {(link.source, link.target, link.kind) for link in graph(research).links}
    assert ("REVIEWING", "COMPLETE", GUARDED) in kinds
    assert ("PENDING", "RESEARCHING", SUCCESS) in kinds
    assert ("PENDING", "FAILED", FAILURE) in kinds
    assert ("REVIEWING", research.on_loop_exhausted, LOOP_EXHAUSTED) in kinds


def test_dot_quotes_names_and_draws_failures_dashed() -> None:
    bug = next(d for d in SHIPPED if d.type == "cto_fix_bug")
    dot = to_dot(bug)
    assert dot.startswith('digraph "cto_fix_bug" {') and dot.rstrip().endswith("}")
    assert '"ANALYZE_BUG" -> "LOCATE_CODE";' in dot
    assert 'label="failure", style=dashed' in dot


FIXTURES = {d.type: d for d in load_all(definition_files(str(FIXTURE_DEFINITIONS)))}


def test_a_parallel_state_carries_its_branches_each_a_graph_of_its_own() -> None:
    g = graph(FIXTURES["test_fan_parallel"])
    build = next(n for n in g.nodes if n.id == "BUILD")
    assert (build.kind, build.detail) == (PARALLEL, "join: all")
    assert [b.name for b in g.branches["BUILD"]] == ["tests", "docs"]
    tests = g.branches["BUILD"][0].graph
    assert tests is not None
    assert [(n.id, n.initial) for n in tests.nodes] == [
        ("WRITE", True),
        ("DONE", False),
        ("FAILED", False),
    ]
    assert ("WRITE", "DONE", SUCCESS) in {(k.source, k.target, k.kind) for k in tests.links}
    drawn = g.to_dict()["branches"]["BUILD"]
    assert [b["name"] for b in drawn] == ["tests", "docs"] and drawn[0]["machine"] is None
    assert graph(FIXTURES["test_fan_any"]).nodes[0].detail == "join: any"


def test_a_map_is_one_node_and_a_child_machine_names_its_type() -> None:
    each = graph(FIXTURES["test_fan_map"])
    assert (each.nodes[0].id, each.nodes[0].kind) == ("EACH", MAP)
    assert each.nodes[0].detail == "map over context.items"
    assert each.branches == {}
    child = graph(FIXTURES["test_fan_child"]).nodes[0]
    assert (child.kind, child.detail) == (MACHINE, "→ test_pair")
    assert graph(FIXTURES["test_linear"]).nodes[0].kind == TASK


def test_dot_draws_a_parallel_state_as_a_cluster_left_by_its_join() -> None:
    dot = to_dot(FIXTURES["test_fan_parallel"])
    assert 'subgraph "cluster_BUILD" {' in dot
    assert 'subgraph "cluster_BUILD/tests/" {' in dot
    assert '"BUILD" -> "BUILD/tests/WRITE" [style=dotted];' in dot
    assert '"BUILD/tests/DONE" -> "BUILD/join" [style=dotted];' in dot
    assert '"BUILD/join" -> "SHIP";' in dot
    assert dot.count("{") == dot.count("}")
    assert 'label="EACH\\nmap over context.items"' in to_dot(FIXTURES["test_fan_map"])
