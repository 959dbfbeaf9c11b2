"""The sending end of fsm.enter_state: `Enqueue`, the Handoff every process uses to have states
entered (the client, the scan, fsm.apply_acks), sends the task by name on the app, so that
sending one needs only the app and its broker (the task itself is in worker/tasks.py)."""

from __future__ import annotations

from uuid import UUID

from celery import Celery, Signature, group

from fsm_celery.config import Settings
from fsm_celery.engine import Next, Step
from fsm_celery.traces import entering, starting_children
from fsm_celery.worker.app import app

ENTER_STATE = "fsm.enter_state"


class Enqueue:
    """Sends an fsm.enter_state task for each step, on its machine type's queue (FSM_QUEUES,
    else FSM_QUEUE): at once, or after the step's retry delay.

    A countdown longer than half the broker's visibility timeout would be redelivered while it
    waits; those steps are left to the scan, which enters every state whose dispatch is due.
    On RabbitMQ every delayed step is (worker/broker.py says why).
    """

    def __init__(self, settings: Settings, celery: Celery = app) -> None:
        self.app = celery
        self._settings = settings
        self._queues: dict[str, str] = {}  # by the machine's type (FSM_QUEUES), once each
        self.longest = 0.0 if settings.broker_is_amqp else settings.visibility_timeout_seconds / 2

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
                with entering(step):  # its Celery spans in the machine's trace, if traced
                    self.app.send_task(
                        ENTER_STATE,
                        (str(step.machine_id), step.attempt),
                        queue=self._queue(step.machine_type),
                        countdown=step.delay if step.delay > 0 else None,
                        argsrepr=step_repr(step),
                        producer=producer,
                    )
            for parent, children in fanned.items():  # a fan-out's new children: one group each
                with starting_children(parent, children[0].root_id):
                    group(self._signature(step) for step in children).apply_async(
                        producer=producer, add_to_parent=False
                    )

    def _queue(self, machine_type: str) -> str:
        queue = self._queues.get(machine_type)
        if queue is None:
            queue = self._queues[machine_type] = self._settings.queue_for(machine_type)
        return queue

    def _signature(self, step: Step) -> Signature:
        return self.app.signature(
            ENTER_STATE,
            (str(step.machine_id), step.attempt),
            queue=self._queue(step.machine_type),
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
