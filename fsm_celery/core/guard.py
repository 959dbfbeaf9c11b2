"""Guards: the JMESPath conditions on edges, evaluated on an output and a context."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsm_celery.core.definition import Edge, compile_guard


class GuardFailed(Exception):
    """A guard raised while it was evaluated on an output (a type mismatch, say)."""

    def __init__(self, guard: str, error: Exception) -> None:
        self.guard = guard
        self.error = f"{type(error).__name__}: {error}"
        super().__init__(f"{guard}: {self.error}")


def guard_holds(when: str, output: Mapping[str, Any], context: Mapping[str, Any]) -> bool:
    """Whether the guard is true of the output and the context (GuardFailed if it raises)."""
    try:
        return _truthy(compile_guard(when).search({"output": output, "context": context}))
    except Exception as exc:  # whatever an agent's output makes a guard raise
        raise GuardFailed(when, exc) from exc


def chosen_edge(
    edges: tuple[Edge, ...], output: Mapping[str, Any], context: Mapping[str, Any]
) -> Edge:
    """The first edge whose guard holds (or that has none); GuardFailed if a guard raises."""
    for edge in edges:
        if edge.when is None or guard_holds(edge.when, output, context):
            return edge
    return edges[-1]  # the validator makes the last edge an unguarded default


def _truthy(value: Any) -> bool:
    # JMESPath truthiness: false, null, "", [] and {} are false; 0 is true.
    return value is not None and value is not False and value != "" and value != [] and value != {}
