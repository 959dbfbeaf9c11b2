"""What the other processes send to the workers: enter_state tasks (from the client, the scan
and apply_acks) and apply_acks tasks (from the ack bridge in the celery mode).

Tasks are sent by name on the app, so that sending one does not import the task bodies (nor
what they run on): a client or a bridge needs only the Celery app and its broker.
"""

from __future__ import annotations

import json

from fsm_celery.config import Settings
from fsm_celery.engine import Inbound, Step
from fsm_celery.worker.app import app

ENTER_STATE = "fsm.enter_state"
APPLY_ACKS = "fsm.apply_acks"
ACKS_SHOWN = 20  # machines an apply_acks task names in Flower


class Enqueue:
    """Send an enter_state task for each step, on the settings' queue: at once, or after the
    step's retry delay.

    A countdown longer than half the broker's visibility timeout would be redelivered while it
    waits; those steps are left to the scan, which enters every state whose dispatch is due.
    """

    def __init__(self, settings: Settings) -> None:
        self.queue = settings.queue
        self.longest = settings.visibility_timeout_seconds / 2

    def __call__(self, steps: list[Step]) -> None:
        steps = [step for step in steps if step.delay <= self.longest]
        if not steps:
            return
        with app.producer_or_acquire() as producer:  # one connection for the whole batch
            for step in steps:
                app.send_task(
                    ENTER_STATE,
                    (str(step.machine_id), step.attempt),
                    queue=self.queue,
                    countdown=step.delay if step.delay > 0 else None,
                    argsrepr=step_repr(step),
                    producer=producer,
                )


class Relay:
    """The bridge's hand-off in the celery mode: each batch it read becomes fsm.apply_acks
    tasks (split to carry at most max_relay_bytes of messages each). Once this returns, the
    broker holds the batch (late acks keep it there until a worker applied it), so the bridge
    acknowledges the stream entries. A failed publish raises a transient error: the bridge
    keeps the batch and tries again (a part already published is applied once anyway: its
    acks are then refused as stale)."""

    def __init__(self, settings: Settings) -> None:
        self.queue = settings.queue
        self.max_bytes = settings.max_relay_bytes

    def __call__(self, batch: list[Inbound]) -> list[Inbound]:
        with app.producer_or_acquire() as producer:
            for chunk in chunks(batch, self.max_bytes):
                send_acks(chunk, self.queue, producer=producer)
        return []


def send_acks(batch: list[Inbound], queue: str, **options: object) -> None:
    """One apply_acks task for the batch."""
    app.send_task(APPLY_ACKS, (wire(batch),), queue=queue, argsrepr=acks_repr(batch), **options)


def wire(batch: list[Inbound]) -> list[tuple[str, str | None]]:
    """The messages as fsm.apply_acks takes them (JSON: the sender's id as text)."""
    return [(item.raw, str(item.agent) if item.agent else None) for item in batch]


def chunks(batch: list[Inbound], max_bytes: int) -> list[list[Inbound]]:
    """The batch in consecutive parts of at most max_bytes of messages (a larger message alone)."""
    parts: list[list[Inbound]] = [[]]
    size = 0
    for item in batch:
        if parts[-1] and size + len(item.raw) > max_bytes:
            parts.append([])
            size = 0
        parts[-1].append(item)
        size += len(item.raw)
    return [part for part in parts if part]


def step_repr(step: Step) -> str:
    """How Flower shows an enter_state task: what it enters, searchable by machine id."""
    return f"{step.machine_type} {step.machine_id} state={step.state} attempt={step.attempt}"


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
