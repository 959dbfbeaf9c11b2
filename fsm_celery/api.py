"""The default client of this process, configured from the environment, and its functions."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any
from uuid import UUID

from fsm_celery.channel.redis import RedisDispatcher, connect
from fsm_celery.config import Settings, get_settings
from fsm_celery.engine import MachineEngine
from fsm_celery.ops import Client, MachineInfo, TransitionRecord
from fsm_celery.store.db import make_engine


def redis_engine(settings: Settings, pre_ping: bool = True) -> MachineEngine:
    """An engine on the configured database that dispatches to agents through Redis."""
    dispatcher = RedisDispatcher(
        connect(settings.redis_url), settings.channel_prefix, settings.task_streams
    )
    db = make_engine(settings.database_url, pre_ping=pre_ping)
    return MachineEngine(db, dispatcher, settings)


def celery_client(settings: Settings) -> Client:
    """A client that enqueues state entries on the Celery broker."""
    from fsm_celery.channel.bridge import DeadLetters
    from fsm_celery.worker.tasks import enter

    dead = DeadLetters(connect(settings.redis_url), settings.channel_prefix)
    return Client(redis_engine(settings), enter, dead.latest)


@lru_cache(maxsize=1)
def default_client() -> Client:
    """The client built from FSM_* environment settings on first use."""
    return celery_client(get_settings())


def start_machine(
    machine_type: str,
    context: Mapping[str, Any] | None = None,
    agent_id: UUID | str | None = None,
    github_issue: int | None = None,
) -> UUID:
    """Start a machine; returns its id."""
    return default_client().start_machine(machine_type, context, agent_id, github_issue)


def get_machine(machine_id: UUID | str) -> MachineInfo:
    """The machine with that id."""
    return default_client().get_machine(machine_id)


def list_machines(
    *,
    agent_type: str | None = None,
    status: str | None = None,
    machine_type: str | None = None,
    limit: int = 100,
) -> list[MachineInfo]:
    """Machines, newest first, filtered by agent type, status and machine type."""
    return default_client().list_machines(
        agent_type=agent_type, status=status, machine_type=machine_type, limit=limit
    )


def history(machine_id: UUID | str) -> list[TransitionRecord]:
    """The machine's transitions in order."""
    return default_client().history(machine_id)


def stats() -> dict[str, Any]:
    """Machines per type and status, rejected messages per reason."""
    return default_client().stats()
