"""An SDK agent's metrics (fsm_celery.agent.sdk): the tasks it answered by outcome, those in
hand, its reconnects to Redis; served on FSM_METRICS_PORT when set (nothing counted else)."""

from __future__ import annotations

from collections.abc import Sized
from typing import TYPE_CHECKING, Any, Protocol

from fsm_celery.config import Settings

if TYPE_CHECKING:
    import redis


class Watching(Protocol):
    def done(self, reply: dict[str, Any] | None, /) -> None:
        """A task's entry was finished with this reply (None: dropped, nothing sent)."""

    def reconnected(self) -> redis.Redis | None:
        """The agent lost Redis and connects again: the client it uses now (None: a new one
        on next use)."""


class _Nothing:
    def done(self, reply: dict[str, Any] | None, /) -> None:
        pass

    def reconnected(self) -> redis.Redis | None:
        return None


class _Counting:
    def __init__(self, agent_type: str, running: Sized) -> None:
        from fsm_celery.metrics.instruments import instruments

        m = instruments()
        self._tasks = m["fsm_agent_tasks_total"]
        self._reconnects = m["fsm_redis_reconnects_total"].labels("agent")
        self._type = agent_type
        m["fsm_agent_running"].labels(agent_type).set_function(lambda: len(running))
        for seen in ("succeeded", "failed", "handed_back", "dropped"):  # each seen at 0
            self._tasks.labels(agent_type, seen)

    def done(self, reply: dict[str, Any] | None, /) -> None:
        self._tasks.labels(self._type, outcome(reply)).inc()

    def reconnected(self) -> redis.Redis | None:
        self._reconnects.inc()
        return None


def outcome(reply: dict[str, Any] | None) -> str:
    """A task's outcome, by the reply that finished it."""
    if reply is None:
        return "dropped"
    if reply.get("type") == "state_handback":
        return "handed_back"
    return "succeeded" if reply.get("success") else "failed"


def watch(agent_type: str, running: Sized, settings: Settings) -> Watching:
    """What counts the agent's work: served on FSM_METRICS_PORT, or nothing when unset."""
    if not settings.metrics_port:
        return _Nothing()
    from fsm_celery.metrics.instruments import serve

    counting = _Counting(agent_type, running)
    serve(settings.metrics_port, settings.metrics_address, "agent")
    return counting
