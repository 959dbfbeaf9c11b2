"""Moving messages between the engine and agents: Redis in production, memory for the demo."""

from __future__ import annotations

from typing import Protocol


class Dispatcher(Protocol):
    """Delivers state_tasks to agents (a uuid, or an agent type for unassigned machines)."""

    def dispatch_many(self, messages: list[tuple[str, str]]) -> None:
        """Send each (agent, message), all in as few round trips as the transport allows."""
        ...
