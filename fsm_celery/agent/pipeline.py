"""The research pipeline's agents as durable agents of the engine: process(state) -> state as
handlers of an SDK agent."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsm_celery.agent.sdk import Agent, Handler, Task
from fsm_celery.pipeline.agents import PipelineAgent
from fsm_celery.pipeline.orchestrator import PIPELINE, as_node, default_agents, finalize
from fsm_celery.pipeline.state import TaskState


def pipeline_handler(agent: PipelineAgent) -> Handler:
    """A handler that runs the agent on the TaskState in the machine's context."""

    node = as_node(agent)

    def handle(task: Task) -> Mapping[str, Any]:
        return node(task.context)

    return handle


def serve_pipeline(sdk_agent: Agent, agents: Mapping[str, PipelineAgent] | None = None) -> Agent:
    """Register a handler for each working state of the research pipeline."""
    for state, agent in (agents or default_agents()).items():
        sdk_agent.handler(PIPELINE, state)(pipeline_handler(agent))
    return sdk_agent


def durable_result(context: Mapping[str, Any], status: str, error: str | None) -> TaskState:
    """The final TaskState of a finished research_pipeline machine."""
    return finalize(TaskState.from_dict(dict(context["taskState"])), status, error)
