"""What is wrong with a tool state (fsm_celery.core.tool), as load errors naming the field: a
worker makes its call, so it has nothing of an agent's, of a gate's or of a fan-out's; its
arguments' templates must compile. Pure."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jinja2

from fsm_celery.core.definition import StateDefinition
from fsm_celery.core.prompt import TEMPLATES
from fsm_celery.exceptions import Problem

# A worker calls the tool: nobody reads a prompt, no agent type serves it, nobody corrects it.
NOT_IN_A_TOOL_STATE = (
    "prompt",
    "agent_type",
    "max_corrections",
    "heartbeat_timeout",
    "parallel",
    "map",
    "machine",
    "approval",
    "wait",
    "terminal",
)


def tool_problems(state: StateDefinition, source: str) -> Iterator[Problem]:
    """What is wrong with a tool state (none for a state of another kind)."""
    if state.tool is None:
        return
    for field in NOT_IN_A_TOOL_STATE:
        if field in state.model_fields_set and getattr(state, field) not in (None, "", ()):
            yield Problem(
                f"a tool state has no {field}: a worker calls the tool", source, state.name, field
            )
    yield from _templates(state.tool.arguments, source, state.name, "tool.arguments")


def _templates(value: Any, source: str, state: str, where: str) -> Iterator[Problem]:
    if isinstance(value, str):
        try:
            TEMPLATES.parse(value)
        except jinja2.TemplateSyntaxError as exc:
            yield Problem(f"the template does not compile: {exc}", source, state, where)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _templates(item, source, state, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _templates(item, source, state, f"{where}[{i}]")
