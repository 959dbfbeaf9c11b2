"""Moving messages between the engine and agents: Redis in production, memory for the demo."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fsm_celery.core.messages import StateEvent


class Dispatcher(Protocol):
    """Delivers state_tasks to agents (a uuid, or an agent type for unassigned machines), and
    announces committed transitions to whoever listens."""

    def dispatch_many(self, messages: list[tuple[str, str]]) -> None:
        """Send each (agent, message), all in as few round trips as the transport allows."""
        ...

    def cancel_many(self, messages: list[tuple[str, str]]) -> None:
        """Send each (agent, state_cancel) where the agent reads it (its task stream); never
        raises: the command committed, and an agent that misses it learns from its next task."""
        ...

    def announce(self, events: Sequence[StateEvent]) -> None:
        """Publish the events on the events channel; never raises (a listener may miss them,
        a transition must not fail for it)."""
        ...
