"""The sending end of fsm.call_tool (the task is in worker/tasks.py): `CallTools`, the engine's
Caller (fsm_celery.engine.ports) in every process that enters states, sends one task for each
tool state a transaction entered, once it committed, on FSM_TOOL_QUEUE (else the machine
type's queue): a tool's call waits on the tool, so a deployment may give those its own
workers."""

from __future__ import annotations

from celery import Celery

from fsm_celery.config import Settings
from fsm_celery.engine import Next
from fsm_celery.traces import entering
from fsm_celery.worker.app import app
from fsm_celery.worker.enqueue import step_repr

CALL_TOOL = "fsm.call_tool"


class CallTools:
    def __init__(self, settings: Settings, celery: Celery = app) -> None:
        self.app = celery
        self._settings = settings

    def __call__(self, calls: Next) -> None:
        with self.app.producer_or_acquire() as producer:  # one connection for them all
            for step in calls:
                with entering(step):  # its Celery spans in the machine's trace, if traced
                    self.app.send_task(
                        CALL_TOOL,
                        (str(step.machine_id), step.attempt),
                        queue=self._settings.tool_queue
                        or self._settings.queue_for(step.machine_type),
                        argsrepr=step_repr(step),
                        producer=producer,
                    )
