"""Celery tasks: thin, idempotent, taking ids. Each asks the engine and enqueues what follows."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any
from uuid import UUID

from celery import Task
from celery.signals import beat_init, celeryd_init, worker_process_init

from fsm_celery.acks import TRANSIENT, AckApplier
from fsm_celery.channel.bridge import DeadLetters
from fsm_celery.channel.redis import connect
from fsm_celery.config import get_settings
from fsm_celery.core.messages import agent_ack_stream
from fsm_celery.engine import Inbound, MachineEngine, Step
from fsm_celery.worker.app import app

log = logging.getLogger(__name__)

_engine: MachineEngine | None = None
_building = threading.Lock()
SCAN_BATCH = 500  # machines per scan transaction
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
                from fsm_celery.api import redis_engine

                # Without a ping per transaction: a task that meets a connection a database
                # restart broke fails with a transient error, the pool is discarded, and the
                # task is retried.
                _engine = redis_engine(get_settings(), pre_ping=False)
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
    steps = [step for step in steps if step.delay <= longest]
    if not steps:
        return
    with app.producer_or_acquire() as producer:  # one connection for the whole batch
        for step in steps:
            enter_state.apply_async(
                (str(step.machine_id), step.attempt),
                countdown=step.delay if step.delay > 0 else None,
                argsrepr=step_repr(step),
                producer=producer,
            )


def step_repr(step: Step) -> str:
    """How Flower shows an enter_state task: what it enters, searchable by machine id."""
    return f"{step.machine_type} {step.machine_id} state={step.state} attempt={step.attempt}"


@app.task(name="fsm.enter_state", **RETRY)
def enter_state(machine_id: str, attempt: int) -> None:
    """Dispatch the attempt's state_task (a no-op when it was dispatched already)."""
    engine().enter_state(UUID(machine_id), attempt)


@app.task(name="fsm.apply_acks", bind=True, **RETRY)
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
    failed = AckApplier(engine(), enter, inline=False)(batch)
    if not failed:
        return len(batch)
    settings = get_settings()
    if task.request.retries + 1 < settings.dead_letter_after:
        raise task.retry(args=(_wire(failed),), countdown=1, argsrepr=acks_repr(failed))
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


class Relay:
    """The bridge's hand-off in the celery mode: each batch it read becomes fsm.apply_acks
    tasks (split to carry at most max_bytes of messages each). Once this returns, the broker
    holds the batch (late acks keep it there until a worker applied it), so the bridge
    acknowledges the stream entries. A failed publish raises a transient error: the bridge
    keeps the batch and tries again (a part already published is applied once anyway: its
    acks are then refused as stale)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    def __call__(self, batch: list[Inbound]) -> list[Inbound]:
        for chunk in _chunks(batch, self.max_bytes):
            apply_acks.apply_async((_wire(chunk),), argsrepr=acks_repr(chunk))
        return []


def _wire(batch: list[Inbound]) -> list[tuple[str, str | None]]:
    """The messages as fsm.apply_acks takes them (JSON: the sender's id as text)."""
    return [(item.raw, str(item.agent) if item.agent else None) for item in batch]


def _chunks(batch: list[Inbound], max_bytes: int) -> list[list[Inbound]]:
    chunks: list[list[Inbound]] = [[]]
    size = 0
    for item in batch:
        if chunks[-1] and size + len(item.raw) > max_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += len(item.raw)
    return [chunk for chunk in chunks if chunk]


ACKS_SHOWN = 20  # machines an apply_acks task names in Flower


def acks_repr(batch: list[Inbound]) -> str:
    """How Flower shows an apply_acks task: how many messages, and for which machines, states
    and attempts (the first ACKS_SHOWN; ids in full, so that a search by machine id finds it)."""
    shown = ", ".join(_message_repr(item.raw) for item in batch[:ACKS_SHOWN])
    more = f", and {len(batch) - ACKS_SHOWN} more" if len(batch) > ACKS_SHOWN else ""
    return f"{len(batch)} message{'s' if len(batch) != 1 else ''}: {shown}{more}"


def _message_repr(raw: str) -> str:
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError):
        return "(not JSON)"
    if not isinstance(message, dict):
        return "(not an object)"
    kind = str(message.get("type", "?"))[:20]
    if kind == "agent_status":
        return f"agent_status {str(message.get('agentId', '?'))[:40]}"
    machine = str(message.get("machineId", "?"))[:40]
    state = str(message.get("state", "?"))[:50]
    return f"{kind} {machine} state={state} attempt={str(message.get('attempt', '?'))[:12]}"


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
