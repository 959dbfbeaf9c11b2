"""The kind of a state, by what its definition gives it: the name of the engine's state-kind
plug-in that enters it (fsm_celery.engine.kinds: a new kind is a module there, one line in its
table, and its name here)."""

from __future__ import annotations

from fsm_celery.core.definition import StateDefinition


def state_kind(state: StateDefinition) -> str:
    """The kind of a state, by what its definition gives it."""
    if state.fans_out:
        return "fan_out"
    if state.approval is not None:
        return "approval"
    if state.wait is not None:
        return "wait"
    if state.tool is not None:
        return "tool"
    return "agent"
