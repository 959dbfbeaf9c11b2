"""A definition exported as a LangGraph StateGraph runs as the engine would (real langgraph)."""

from __future__ import annotations

from typing import Any

import pytest

from fsm_celery.core.loader import load_text
from fsm_celery.langgraph import initial_graph_state, run_config, to_state_graph
from fsm_celery.pipeline.orchestrator import (
    AgentOrchestrator,
    as_node,
    default_agents,
    load_pipeline_definition,
    pipeline_context,
)
from fsm_celery.pipeline.state import TaskState


@pytest.mark.parametrize("rejections", [0, 2, 5])
def test_exported_pipeline_takes_the_orchestrators_path(rejections: int) -> None:
    definition = load_pipeline_definition()
    nodes = {state: as_node(agent) for state, agent in default_agents().items()}
    graph = to_state_graph(definition, nodes).compile()
    start = TaskState("q", max_iterations=3, metadata={"rejections": rejections})
    result = graph.invoke(
        initial_graph_state(definition, pipeline_context(start)), run_config(definition)
    )
    orchestrator = AgentOrchestrator()
    final = orchestrator.run("q", max_iterations=3, rejections=rejections)
    assert result["visited"] == orchestrator.visited
    assert TaskState.from_dict(result["context"]["taskState"]).findings == final.findings


def test_failures_retry_and_take_the_failure_edge_in_the_graph() -> None:
    definition = load_text("""
type: flaky
agent_type: x
initial_state: TRY
states:
  - {name: TRY, max_retries: 1, backoff: {delay: 0}, on_success: DONE, on_failure: GAVE_UP}
  - {name: DONE, terminal: completed}
  - {name: GAVE_UP, terminal: failed}
""")
    calls: list[dict[str, Any]] = []

    def always_fails(context: dict[str, Any]) -> dict[str, Any]:
        calls.append(context)
        raise RuntimeError("no network")

    graph = to_state_graph(definition, {"TRY": always_fails}).compile()
    result = graph.invoke(initial_graph_state(definition, {}), run_config(definition))
    assert result["visited"] == ["TRY", "TRY", "GAVE_UP"]
    assert (result["status"], result["error"]) == ("failed", "RuntimeError: no network")
    assert len(calls) == 2


def test_every_working_state_needs_a_node() -> None:
    with pytest.raises(ValueError, match="no node for state"):
        to_state_graph(load_pipeline_definition(), {})
