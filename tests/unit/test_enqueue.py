"""What Flower shows of an fsm.enter_state task."""

from __future__ import annotations

import uuid

from fsm_celery.engine import Step
from fsm_celery.worker.enqueue import step_repr


def test_an_enter_state_task_names_type_machine_state_and_attempt() -> None:
    machine = uuid.uuid4()
    step = Step(machine, 2, 0.0, "INVESTIGATE", "cto_fix_bug")
    assert step_repr(step) == f"cto_fix_bug {machine} state=INVESTIGATE attempt=2"
