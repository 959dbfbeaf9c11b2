"""Celery tasks: thin, idempotent, taking ids. Each asks the engine and enqueues what follows."""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

import redis
import sqlalchemy.exc
from celery.signals import worker_process_init

from fsm_celery.config import get_settings
from fsm_celery.engine import MachineEngine, Step
from fsm_celery.worker.app import app

log = logging.getLogger(__name__)

_engine: MachineEngine | None = None
TRANSIENT = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    redis.ConnectionError,
    redis.TimeoutError,
)
RETRY: dict[str, Any] = {
    "autoretry_for": TRANSIENT,
    "retry_backoff": True,
    "retry_backoff_max": 30,
    "retry_jitter": True,
    "max_retries": None,
}


def engine() -> MachineEngine:
    """This process's engine, built on first use (after the prefork worker forked)."""
    global _engine
    if _engine is None:
        from fsm_celery.api import redis_engine

        _engine = redis_engine(get_settings())
    return _engine


def install_engine(machine_engine: MachineEngine) -> None:
    """Use this engine in this process (the embedded demo runs SQLite and in-memory agents)."""
    global _engine
    _engine = machine_engine


@worker_process_init.connect
def _forget_parent_connections(**_: Any) -> None:
    global _engine
    _engine = None


def _countdown(seconds: float) -> float:
    # A countdown longer than the broker's visibility timeout would be redelivered while it
    # waits; checks are capped below it and re-scheduled, the database deadline being the truth.
    return max(0.0, min(seconds, engine().settings.visibility_timeout_seconds / 2))


def enter(steps: list[Step]) -> None:
    """Enqueue enter_state for each step (after the transaction that decided it committed)."""
    for step in steps:
        args = (str(step.machine_id), step.attempt)
        if step.delay > 0:
            enter_state.apply_async(args, countdown=_countdown(step.delay))
        else:
            enter_state.delay(*args)


@app.task(name="fsm.enter_state", **RETRY)
def enter_state(machine_id: str, attempt: int) -> None:
    """Dispatch the attempt's state_task and schedule its timeout check."""
    seconds = engine().enter_state(UUID(machine_id), attempt)
    if seconds is not None:
        check_timeout.apply_async((machine_id, attempt), countdown=_countdown(seconds))


@app.task(name="fsm.apply_messages", **RETRY)
def apply_messages(payloads: list[str]) -> None:
    """Apply a batch of raw state_ack / state_heartbeat payloads in one transaction."""
    enter(engine().apply_messages(payloads))


@app.task(name="fsm.check_timeout", **RETRY)
def check_timeout(machine_id: str, attempt: int) -> None:
    """Time the attempt out if its deadline passed; re-check later if it was extended."""
    found = engine().check_timeout(UUID(machine_id), attempt)
    if found.wait_seconds is not None:
        check_timeout.apply_async((machine_id, attempt), countdown=_countdown(found.wait_seconds))
    enter(found.steps)


@app.task(name="fsm.sweep", **RETRY)
def sweep() -> None:
    """Repair machines whose dispatch or timeout was lost; the database is the truth."""
    due, overdue = engine().sweep()
    if due or overdue:
        log.warning(
            "sweeper: re-entering %d machines, checking %d deadlines", len(due), len(overdue)
        )
    enter(due)
    for step in overdue:
        check_timeout.delay(str(step.machine_id), step.attempt)
