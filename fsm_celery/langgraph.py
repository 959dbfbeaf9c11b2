"""LangGraph interop (extra: fsm-celery[langgraph]).

- `to_state_graph(definition, nodes)` exports a definition as a LangGraph StateGraph whose
  routing is decided by the same pure core as the engine: guards, retries, failure edges and
  loop bounds behave as they do in a durable run.
- `node_handler(node)` lets a LangGraph-style node (state dict in, update dict out) serve as a
  durable agent's handler for a state.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from fsm_celery.agent.sdk import Handler, Task
from fsm_celery.core.attempt_events import Ack
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.transition import Machine, MachineStatus, Transition, decide, initial_context

Node = Callable[[dict[str, Any]], Mapping[str, Any]]


class FsmGraphState(TypedDict, total=False):
    """What flows through the exported graph: the machine's context and its position."""

    context: dict[str, Any]
    state: str
    attempt: int
    retries: int
    status: str
    error: str | None
    visited: Annotated[list[str], operator.add]


def to_state_graph(definition: MachineDefinition, nodes: Mapping[str, Node]) -> StateGraph:
    """The definition as an uncompiled StateGraph; `nodes` does the work of each state."""
    missing = [s.name for s in definition.states if s.terminal is None and s.name not in nodes]
    if missing:
        raise ValueError(f"{definition.type}: no node for state(s) {', '.join(missing)}")
    graph = StateGraph(FsmGraphState)
    for state in definition.states:
        if state.terminal is None:
            graph.add_node(state.name, _step(definition, state.name, nodes[state.name]))
            targets = {t: t for t in _targets(definition, state.name)}
            graph.add_conditional_edges(state.name, _route, {**targets, END: END})
    graph.add_edge(START, definition.initial_state)
    return graph


def initial_graph_state(
    definition: MachineDefinition, context: Mapping[str, Any]
) -> dict[str, Any]:
    """The input that starts the exported graph, as start_machine starts a machine."""
    return {
        "context": initial_context(definition, context),
        "state": definition.initial_state,
        "attempt": 1,
        "retries": 0,
        "status": MachineStatus.RUNNING.value,
        "visited": [definition.initial_state],
    }


def run_config(definition: MachineDefinition) -> dict[str, Any]:
    """The invoke() config that lets the longest legal run finish (LangGraph stops at 25 steps)."""
    return {"recursion_limit": definition.step_bound() + 5}


def node_handler(node: Node) -> Handler:
    """A durable agent handler that runs a LangGraph-style node on the machine's context."""

    def handle(task: Task) -> Mapping[str, Any]:
        return dict(node(dict(task.context)))

    return handle


def _step(
    definition: MachineDefinition, name: str, node: Node
) -> Callable[[FsmGraphState], dict[str, Any]]:
    def step(s: FsmGraphState) -> dict[str, Any]:
        machine = Machine(
            uuid.UUID(int=0), name, MachineStatus.RUNNING, s["attempt"], s["retries"], s["context"]
        )
        try:
            event = Ack(name, s["attempt"], True, dict(node(dict(s["context"]))))
        except Exception as exc:
            event = Ack(name, s["attempt"], False, {}, f"{type(exc).__name__}: {exc}")
        t = decide(definition, machine, event)
        assert isinstance(t, Transition)  # the event is made for this machine
        return {
            "context": t.context,
            "state": t.to_state,
            "attempt": t.attempt,
            "retries": t.state_retries,
            "status": t.status.value,
            "error": t.error,
            "visited": [t.to_state],
        }

    return step


def _route(s: FsmGraphState) -> str:
    return s["state"] if s["status"] == MachineStatus.RUNNING.value else END


def _targets(definition: MachineDefinition, name: str) -> set[str]:
    state = definition.state(name)
    targets = {e.target for e in state.edges} | {name}  # a retry stays in the state
    if any(e.loop for e in state.edges):
        targets.add(definition.on_loop_exhausted)
    return {t for t in targets if definition.state(t).terminal is None}
