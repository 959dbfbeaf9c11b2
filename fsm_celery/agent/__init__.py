"""Agents: the SDK (`from fsm_celery.agent import Agent, Task, run`) and the mock agents.

Re-exported lazily, so that importing fsm_celery.agent.mock alone loads no more than it needs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsm_celery.agent.runner import run
    from fsm_celery.agent.sdk import ANY, Agent, Failed, HandBack, NoAck, Task

__all__ = ["ANY", "Agent", "Failed", "HandBack", "NoAck", "Task", "run"]

_WHERE = {
    "ANY": "fsm_celery.agent.sdk",
    "Agent": "fsm_celery.agent.sdk",
    "Failed": "fsm_celery.agent.sdk",
    "HandBack": "fsm_celery.agent.sdk",
    "NoAck": "fsm_celery.agent.sdk",
    "Task": "fsm_celery.agent.sdk",
    "run": "fsm_celery.agent.runner",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'fsm_celery.agent' has no attribute {name!r}")
    import importlib

    found = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = found
    return found
