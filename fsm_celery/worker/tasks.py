"""Celery tasks: thin, idempotent, taking ids. Each asks the engine and enqueues what follows."""

from __future__ import annotations

import logging
import threading
from typing import Any
from uuid import UUID

from celery import Task
from celery.signals import beat_init, celeryd_init, worker_process_init

from fsm_celery.batches import TRANSIENT, BatchApplier
from fsm_celery.channel.bridge import DeadLetters
from fsm_celery.channel.redis import connect
from fsm_celery.config import get_settings
from fsm_celery.core.messages import agent_ack_stream
from fsm_celery.engine import Inbound, MachineEngine, Next
from fsm_celery.wiring import machine_engine
from fsm_celery.worker.app import app
from fsm_celery.worker.enqueue import APPLY_ACKS, ENTER_STATE, Enqueue, acks_repr, wire

log = logging.getLogger(__name__)

_engine: MachineEngine | None = None
_building = threading.Lock()
SCAN_BATCH = 500  # machines per scan transaction
# The engine's periodic work sends no events (send_events=False below): beat sends it every
# second, and Flower would list little else. Its failures are in the worker's log, its
# liveness in `fsm-celery doctor` (beat's last scan).
RETRY: dict[str, Any] = {
    "autoretry_for": TRANSIENT,
    "retry_backoff": True,
    "retry_backoff_max": 30,
    "retry_jitter": True,
    "max_retries": None,
}


def engine() -> MachineEngine:
    """This process's engine, built on first use (after a prefork worker forked), once for all
    the pool's threads."""
    global _engine
    if _engine is None:
        with _building:
            if _engine is None:
                # Without a ping per transaction: a task that meets a connection a database
                # restart broke fails with a transient error, the pool is discarded, and the
                # task is retried.
                _engine = machine_engine(get_settings(), pre_ping=False)
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
        from fsm_celery.errors import fail
        from fsm_celery.exceptions import InsecureSecret

        fail(InsecureSecret(problem))


@worker_process_init.connect
def _forget_parent_connections(**_: Any) -> None:
    global _engine
    _engine = None


def enter(next_states: Next) -> None:
    """Send an enter_state task for each state (on the queue of the engine's settings)."""
    Enqueue(engine().settings)(next_states)


@app.task(name=ENTER_STATE, **RETRY)
def enter_state(machine_id: str, attempt: int) -> None:
    """Dispatch the attempt's state_task (a no-op when it was dispatched already)."""
    enter(engine().entry.enter(UUID(machine_id), attempt))


@app.task(name=APPLY_ACKS, bind=True, **RETRY)
def apply_acks(task: Task, messages: list[tuple[str, str | None]]) -> int:
    """Apply a batch of agent messages, as the bridge read them, in one transaction, and
    enqueue an enter_state task for each state it entered; how many messages it held.

    A redelivery (the worker died after the commit) finds every attempt already answered and
    records the acks as stale; the states it had decided are entered by the scan if their
    enter_state tasks were never sent. A message that can be neither applied nor recorded as
    rejected is tried again alone, a second later, and after FSM_DEAD_LETTER_AFTER tries it is
    parked in the dead-letter stream (`fsm-celery rejected --parked`).
    """
    batch = [Inbound(raw, UUID(agent) if agent else None) for raw, agent in messages]
    failed = BatchApplier(engine(), enter, inline=False)(batch)
    if not failed:
        return len(batch)
    settings = engine().settings
    if task.request.retries + 1 < settings.dead_letter_after:
        raise task.retry(args=(wire(failed),), countdown=1, argsrepr=acks_repr(failed))
    dead = DeadLetters(connect(settings.redis_url), settings.channel_prefix)
    pipe = dead.client.pipeline(transaction=False)
    reason = f"could not be applied nor recorded {settings.dead_letter_after} times"
    for item in failed:
        source = (
            agent_ack_stream(str(item.agent), settings.channel_prefix) if item.agent else "shared"
        )
        dead.park(pipe, item.raw, source, reason)
    try:
        pipe.execute()
    finally:
        dead.client.close()
    return len(batch)


@app.task(name="fsm.scan", send_events=False, **RETRY)
def scan() -> None:
    """Time out overdue attempts and enter due states (beat runs it every second)."""
    while True:
        handled, next_states = engine().scan.run(SCAN_BATCH)
        enter(next_states)
        if handled < SCAN_BATCH:  # else a backlog: drain it now, batch after batch
            return


@app.task(name="fsm.run_schedules", send_events=False, **RETRY)
def run_schedules() -> int:
    """Start a machine for each schedule whose cron tick is due (beat runs it every second);
    how many schedules were due."""
    due, next_states = engine().schedules.run()
    enter(next_states)
    return due


@app.task(name="fsm.fold_stats", send_events=False, **RETRY)
def fold_stats() -> int:
    """Fold the attempts recorded since the last fold into the statistics' counters (beat,
    every few seconds); how many."""
    return engine().stats.fold()


@app.task(name="fsm.notify", send_events=False, **RETRY)
def send_notifications() -> int:
    """Send the notifications of machines that ended (beat, every second); how many went."""
    delivered, _ = engine().notifier.deliver()
    return delivered


@app.task(name="fsm.prune", send_events=False, **RETRY)
def prune() -> None:
    """Delete rejected messages and silent agents past their retention (beat, every minute)."""
    rejections, agents = engine().scan.prune()
    if rejections or agents:
        log.info("pruned %d rejected messages and %d agents", rejections, agents)
