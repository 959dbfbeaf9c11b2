"""Celery tasks: thin, idempotent, taking ids. Each asks the engine and hands on what follows.

Both ends of fsm.enter_state are here: `Enqueue`, the Handoff every process uses to have
states entered (the client, the scan, fsm.apply_acks), sends the task by name on the app, so
that sending one needs only the app and its broker; the task enters the state. What the tasks
run on is given by the worker's composition root (fsm_celery.celery, through `provide`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol
from uuid import UUID

from celery import Celery, Signature, group

from fsm_celery.acks.apply import RETRY
from fsm_celery.config import Settings
from fsm_celery.engine import MachineEngine, Next, Step
from fsm_celery.worker.app import app

log = logging.getLogger(__name__)

ENTER_STATE = "fsm.enter_state"
SCAN_BATCH = 500  # machines per scan transaction
# The engine's periodic work sends no events (send_events=False below): beat sends it every
# second, and Flower would list little else. Its failures are in the worker's log, its
# liveness in `fsm-celery doctor` (beat's last scan).


class Enqueue:
    """Sends an fsm.enter_state task for each step, on its machine type's queue (FSM_QUEUES,
    else FSM_QUEUE): at once, or after the step's retry delay.

    A countdown longer than half the broker's visibility timeout would be redelivered while it
    waits; those steps are left to the scan, which enters every state whose dispatch is due.
    """

    def __init__(self, settings: Settings, celery: Celery = app) -> None:
        self.app = celery
        self.queue_for = settings.queue_for  # by the machine's type (FSM_QUEUES)
        self.longest = settings.visibility_timeout_seconds / 2

    def __call__(self, next_states: Next) -> None:
        steps = [step for step in next_states if step.delay <= self.longest]
        if not steps:
            return
        fanned: dict[UUID, list[Step]] = {}
        with self.app.producer_or_acquire() as producer:  # one connection for the whole batch
            for step in steps:
                if step.parent_id is not None:
                    fanned.setdefault(step.parent_id, []).append(step)
                    continue
                self.app.send_task(
                    ENTER_STATE,
                    (str(step.machine_id), step.attempt),
                    queue=self.queue_for(step.machine_type),
                    countdown=step.delay if step.delay > 0 else None,
                    argsrepr=step_repr(step),
                    producer=producer,
                )
            for children in fanned.values():  # a fan-out's new children: one group each
                group(self._signature(step) for step in children).apply_async(
                    producer=producer, add_to_parent=False
                )

    def _signature(self, step: Step) -> Signature:
        return self.app.signature(
            ENTER_STATE,
            (str(step.machine_id), step.attempt),
            queue=self.queue_for(step.machine_type),
            argsrepr=step_repr(step),
            immutable=True,
        )


def step_repr(step: Step) -> str:
    """How Flower shows an enter_state task: what it enters, searchable by machine id (and
    by its parent's, for a fan-out's child)."""
    parent = f" parent={step.parent_id}" if step.parent_id is not None else ""
    return (
        f"{step.machine_type} {step.machine_id} state={step.state} attempt={step.attempt}{parent}"
    )


class Parts(Protocol):
    """What the tasks run on (given by the worker's composition root)."""

    @property
    def engine(self) -> MachineEngine: ...

    @property
    def enqueue(self) -> Enqueue: ...

    @property
    def entries(self) -> Callable[[list[tuple[UUID, int]]], list[tuple[UUID, int]]]:
        """Enter the steps (and hand on what follows); those to enter again alone."""


_parts: Parts | None = None


def provide(parts: Parts) -> None:
    """Run the tasks on these parts in this process."""
    global _parts
    _parts = parts


def parts() -> Parts:
    if _parts is None:
        raise RuntimeError("fsm-celery's tasks run in a worker started with `celery -A fsm_celery`")
    return _parts


@app.task(name=ENTER_STATE, **RETRY)
def enter_state(machine_id: str, attempt: int) -> None:
    """Dispatch the attempt's state_task (a no-op when it was dispatched already). Entered with
    those of the tasks that run meanwhile in this process, in one transaction (Worker.entries);
    alone when that transaction failed for a reason other than a transient one, so that a
    step that cannot be entered fails its own task only."""
    run = parts()
    step = (UUID(machine_id), attempt)
    if run.entries([step]):
        run.enqueue(run.engine.entry.enter_many([step]))


@app.task(name="fsm.scan", send_events=False, **RETRY)
def scan() -> None:
    """Time out overdue attempts and enter due states (beat runs it every second)."""
    run = parts()
    while True:
        handled, next_states = run.engine.scan.run(SCAN_BATCH)
        run.enqueue(next_states)
        if handled < SCAN_BATCH:  # else a backlog: drain it now, batch after batch
            return


@app.task(name="fsm.run_schedules", send_events=False, **RETRY)
def run_schedules() -> int:
    """Start a machine for each schedule whose cron tick is due (beat runs it every second);
    how many schedules were due."""
    run = parts()
    due, next_states = run.engine.schedules.run()
    run.enqueue(next_states)
    return due


@app.task(name="fsm.fold_stats", send_events=False, **RETRY)
def fold_stats() -> int:
    """Fold the attempts recorded since the last fold into the statistics' counters (beat,
    every few seconds); how many."""
    return parts().engine.stats.fold()


@app.task(name="fsm.notify", send_events=False, **RETRY)
def send_notifications() -> int:
    """Send the notifications of machines that ended (beat, every second); how many went."""
    delivered, _ = parts().engine.notifier.deliver()
    return delivered


@app.task(name="fsm.history", send_events=False, **RETRY)
def history() -> None:
    """Make the history's months ahead, and archive and remove those past their retention
    (beat, every hour; PostgreSQL only)."""
    parts().engine.retention.run()


@app.task(name="fsm.prune", send_events=False, **RETRY)
def prune() -> None:
    """Delete rejected messages and silent agents past their retention (beat, every minute)."""
    rejections, agents = parts().engine.scan.prune()
    if rejections or agents:
        log.info("pruned %d rejected messages and %d agents", rejections, agents)
