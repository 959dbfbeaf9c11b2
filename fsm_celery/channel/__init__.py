"""Moving messages between the engine and agents: Redis in production, memory for the demo."""

from __future__ import annotations

from typing import Protocol


class Dispatcher(Protocol):
    """Delivers a state_task to an agent (a uuid, or an agent type for unassigned machines)."""

    def dispatch(self, agent: str, message: str) -> None: ...
