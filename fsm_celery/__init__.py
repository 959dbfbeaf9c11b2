"""fsm-celery: durable, declarative state machines that drive AI agents over Celery and Redis.

The names below are imported on first use, so that `fsm_celery.core` (the pure definitions,
messages and decisions) imports without Redis, SQLAlchemy or Celery installed.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsm_celery.api import (
        children,
        default_client,
        get_machine,
        history,
        list_machines,
        start_machine,
        stats,
        tree,
    )
    from fsm_celery.client import Client
    from fsm_celery.config import Settings
    from fsm_celery.core.definition import MachineDefinition
    from fsm_celery.core.transition import MachineStatus
    from fsm_celery.exceptions import (
        ContextMismatch,
        DefinitionError,
        FsmError,
        MachineNotFound,
        StartKeyReused,
        UnknownMachineType,
    )
    from fsm_celery.records import MachineInfo, TransitionRecord, TreeNode

_HOME = {
    "Client": "fsm_celery.client",
    "ContextMismatch": "fsm_celery.exceptions",
    "DefinitionError": "fsm_celery.exceptions",
    "FsmError": "fsm_celery.exceptions",
    "MachineDefinition": "fsm_celery.core.definition",
    "MachineInfo": "fsm_celery.records",
    "MachineNotFound": "fsm_celery.exceptions",
    "MachineStatus": "fsm_celery.core.transition",
    "Settings": "fsm_celery.config",
    "StartKeyReused": "fsm_celery.exceptions",
    "TransitionRecord": "fsm_celery.records",
    "TreeNode": "fsm_celery.records",
    "UnknownMachineType": "fsm_celery.exceptions",
    "children": "fsm_celery.api",
    "default_client": "fsm_celery.api",
    "get_machine": "fsm_celery.api",
    "history": "fsm_celery.api",
    "list_machines": "fsm_celery.api",
    "start_machine": "fsm_celery.api",
    "stats": "fsm_celery.api",
    "tree": "fsm_celery.api",
}
__all__ = [
    "Client",
    "ContextMismatch",
    "DefinitionError",
    "FsmError",
    "MachineDefinition",
    "MachineInfo",
    "MachineNotFound",
    "MachineStatus",
    "Settings",
    "StartKeyReused",
    "TransitionRecord",
    "TreeNode",
    "UnknownMachineType",
    "children",
    "default_client",
    "get_machine",
    "history",
    "list_machines",
    "start_machine",
    "stats",
    "tree",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'fsm_celery' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value
