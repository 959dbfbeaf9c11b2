"""Celery tasks: thin, idempotent, taking ids. Each asks the engine and enqueues what follows."""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from celery.signals import beat_init, celeryd_init, worker_process_init

from fsm_celery.acks import TRANSIENT
from fsm_celery.config import get_settings
from fsm_celery.engine import MachineEngine, Step
from fsm_celery.worker.app import app

log = logging.getLogger(__name__)

_engine: MachineEngine | None = None
SCAN_BATCH = 500  # machines per scan transaction
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


@celeryd_init.connect
@beat_init.connect
def _refuse_a_guessable_secret(**_: Any) -> None:
    """A worker or beat signs task tokens: it does not start with a secret anyone could know."""
    problem = get_settings().secret_problem()
    if problem is not None:
        from fsm_celery.exceptions import InsecureSecret

        raise SystemExit(f"fsm-celery: {InsecureSecret(problem)}")


@worker_process_init.connect
def _forget_parent_connections(**_: Any) -> None:
    global _engine
    _engine = None


def enter(steps: list[Step]) -> None:
    """Enqueue enter_state for each step: at once, or after its retry delay.

    A countdown longer than half the broker's visibility timeout would be redelivered while it
    waits; those steps are left to the scan, which enters every state whose dispatch is due.
    """
    longest = get_settings().visibility_timeout_seconds / 2
    for step in steps:
        args = (str(step.machine_id), step.attempt)
        if step.delay <= 0:
            enter_state.delay(*args)
        elif step.delay <= longest:
            enter_state.apply_async(args, countdown=step.delay)


@app.task(name="fsm.enter_state", **RETRY)
def enter_state(machine_id: str, attempt: int) -> None:
    """Dispatch the attempt's state_task (a no-op when it was dispatched already)."""
    engine().enter_state(UUID(machine_id), attempt)


@app.task(name="fsm.scan", **RETRY)
def scan() -> None:
    """Time out overdue attempts and enter due states (beat runs it every second)."""
    while True:
        handled, delayed = engine().scan(SCAN_BATCH)
        enter(delayed)
        if handled < SCAN_BATCH:  # else a backlog: drain it now, batch after batch
            return


@app.task(name="fsm.prune", **RETRY)
def prune() -> None:
    """Delete rejected messages and silent agents past their retention (beat, every minute)."""
    rejections, agents = engine().prune()
    if rejections or agents:
        log.info("pruned %d rejected messages and %d agents", rejections, agents)
