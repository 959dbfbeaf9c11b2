"""fsm-celery: durable, declarative state machines that drive AI agents over Celery and Redis."""

from __future__ import annotations

from fsm_celery.api import (
    default_client,
    get_machine,
    history,
    list_machines,
    start_machine,
    stats,
)
from fsm_celery.config import Settings
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.transition import MachineStatus
from fsm_celery.exceptions import (
    DefinitionError,
    FsmError,
    MachineNotFound,
    UnknownMachineType,
)
from fsm_celery.ops import Client, MachineInfo, TransitionRecord

__all__ = [
    "Client",
    "DefinitionError",
    "FsmError",
    "MachineDefinition",
    "MachineInfo",
    "MachineNotFound",
    "MachineStatus",
    "Settings",
    "TransitionRecord",
    "UnknownMachineType",
    "default_client",
    "get_machine",
    "history",
    "list_machines",
    "start_machine",
    "stats",
]
