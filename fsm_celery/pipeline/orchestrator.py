"""AgentOrchestrator: runs the research pipeline in-process, deciding every step with the same
pure core the durable engine uses, so both take the same path for the same query."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from fsm_celery.core.attempt_events import Ack
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.loader import SHIPPED_DEFINITIONS, load_file
from fsm_celery.core.transition import Machine, MachineStatus, Transition, decide, initial_context
from fsm_celery.pipeline.agents import (
    AnalyzerAgent,
    IntakeAgent,
    PipelineAgent,
    ResearchAgent,
    ReviewerAgent,
)
from fsm_celery.pipeline.state import TaskState, TaskStatus

PIPELINE = "research_pipeline"


def default_agents() -> dict[str, PipelineAgent]:
    """The agent for each working state, in mock mode."""
    return {
        "PENDING": IntakeAgent(),
        "RESEARCHING": ResearchAgent(),
        "ANALYZING": AnalyzerAgent(),
        "REVIEWING": ReviewerAgent(),
    }


def load_pipeline_definition(path: str | Path | None = None) -> MachineDefinition:
    """The research_pipeline definition (by default the shipped one)."""
    return load_file(path or SHIPPED_DEFINITIONS / f"{PIPELINE}.yaml")


def pipeline_context(state: TaskState) -> dict[str, Any]:
    """The machine context that starts a run: the state, and its iteration bound as loops."""
    return {"taskState": state.to_dict(), "maxRetries": max(state.max_iterations - 1, 0)}


def output_of(state: TaskState) -> dict[str, Any]:
    """An agent's result as an ack output: the new state, and the reviewer's verdict."""
    return {"taskState": state.to_dict(), "approved": state.approved}


def as_node(agent: PipelineAgent) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """The agent as a graph node: machine context in, ack output (an update) out."""

    def node(context: Mapping[str, Any]) -> dict[str, Any]:
        return output_of(agent.process(TaskState.from_dict(dict(context["taskState"]))))

    return node


def finalize(state: TaskState, status: str, error: str | None) -> TaskState:
    """The state a finished run reports: COMPLETE, or FAILED with the reason."""
    if status == MachineStatus.COMPLETED:
        return replace(state, status=TaskStatus.COMPLETE, error=None)
    return replace(state, status=TaskStatus.FAILED, error=error)


class AgentOrchestrator:
    """Drives TaskState through the pipeline's agents; agents never call each other."""

    def __init__(
        self,
        agents: Mapping[str, PipelineAgent] | None = None,
        definition: MachineDefinition | None = None,
    ) -> None:
        self.agents = dict(agents or default_agents())
        self.definition = definition or load_pipeline_definition()
        self.transitions: list[Transition] = []

    @property
    def visited(self) -> list[str]:
        """The states the last run entered, in order."""
        if not self.transitions:
            return []
        return [self.transitions[0].from_state] + [t.to_state for t in self.transitions]

    def run(self, query: str, max_iterations: int = 3, **metadata: Any) -> TaskState:
        """Research, analyse and review the query; the final TaskState."""
        return self.run_state(TaskState(query, max_iterations=max_iterations, metadata=metadata))

    def run_state(self, state: TaskState) -> TaskState:
        """Run the pipeline from a prepared TaskState."""
        d = self.definition
        machine = Machine(
            uuid.uuid4(),
            d.initial_state,
            MachineStatus.RUNNING,
            1,
            0,
            initial_context(d, pipeline_context(state)),
        )
        self.transitions = []
        last: Transition | None = None
        while machine.status is MachineStatus.RUNNING:
            current = TaskState.from_dict(machine.context["taskState"])
            try:
                done = self.agents[machine.current_state].process(current)
                event = Ack(machine.current_state, machine.attempt, True, output_of(done))
            except Exception as exc:
                event = Ack(
                    machine.current_state,
                    machine.attempt,
                    False,
                    {},
                    f"{type(exc).__name__}: {exc}",
                )
            decision = decide(d, machine, event)
            assert isinstance(decision, Transition)  # the event always fits the machine
            self.transitions.append(decision)
            last = decision
            machine = Machine(
                machine.id,
                decision.to_state,
                decision.status,
                decision.attempt,
                decision.state_retries,
                decision.context,
            )
        final = TaskState.from_dict(machine.context["taskState"])
        return finalize(final, machine.status.value, last.error if last else None)
