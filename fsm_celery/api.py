"""The Python API's functions: each on the process's default client, built from FSM_*
settings on first use (a process edge, as the CLI is). `Client` is the same API on parts you
give it (fsm_celery.wiring builds them)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any
from uuid import UUID

from fsm_celery.client import Client
from fsm_celery.config import get_settings
from fsm_celery.records import MachineInfo, TransitionRecord, TreeNode
from fsm_celery.wiring import client


@lru_cache(maxsize=1)
def default_client() -> Client:
    """The client built from FSM_* environment settings on first use."""
    return client(get_settings())


def start_machine(
    machine_type: str,
    context: Mapping[str, Any] | None = None,
    agent_id: UUID | str | None = None,
    github_issue: int | None = None,
    key: str | None = None,
) -> UUID:
    """Start a machine; returns its id. With a key, a start repeated with it returns the id of
    the machine the first made (and starts nothing); one that asks another type or context is
    refused (StartKeyReused)."""
    return default_client().start_machine(machine_type, context, agent_id, github_issue, key)


def get_machine(machine_id: UUID | str) -> MachineInfo:
    """The machine with that id."""
    return default_client().get_machine(machine_id)


def list_machines(
    *,
    agent_type: str | None = None,
    status: str | None = None,
    machine_type: str | None = None,
    parent: UUID | str | None = None,
    limit: int = 100,
) -> list[MachineInfo]:
    """Machines, newest first, filtered by agent type, status, machine type and parent."""
    return default_client().list_machines(
        agent_type=agent_type,
        status=status,
        machine_type=machine_type,
        parent=parent,
        limit=limit,
    )


def children(machine_id: UUID | str, limit: int = 100) -> list[MachineInfo]:
    """The machine's children (those its fan-out states started), newest first."""
    return default_client().children(machine_id, limit)


def tree(machine_id: UUID | str) -> TreeNode:
    """The machine and its descendants, a map's many children counted by status."""
    return default_client().tree(machine_id)


def history(machine_id: UUID | str) -> list[TransitionRecord]:
    """The machine's transitions in order."""
    return default_client().history(machine_id)


def stats() -> dict[str, Any]:
    """Machines per type and status, rejected messages per reason."""
    return default_client().stats()
