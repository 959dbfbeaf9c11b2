"""How the celery mode hands batches to fsm.apply_acks, and what Flower shows of its tasks."""

from __future__ import annotations

import json
import uuid

from fsm_celery.engine import Inbound, Step
from fsm_celery.worker.enqueue import ACKS_SHOWN, acks_repr, chunks, step_repr


def _ack(machine: str, state: str = "S0", attempt: int = 1) -> Inbound:
    raw = {"type": "state_ack", "machineId": machine, "state": state, "attempt": attempt}
    return Inbound(json.dumps(raw))


def test_a_batch_is_split_by_bytes_and_a_message_over_the_limit_travels_alone() -> None:
    small, big = Inbound("x" * 10), Inbound("y" * 100)
    assert chunks([small, small, big, small], 25) == [[small, small], [big], [small]]
    assert chunks([], 25) == []


def test_an_apply_acks_task_names_its_machines_states_and_attempts() -> None:
    machine = str(uuid.uuid4())
    shown = acks_repr([_ack(machine, "BUILD", 3), Inbound("{not json")])
    assert shown == f"2 messages: state_ack {machine} state=BUILD attempt=3, (not JSON)"


def test_an_apply_acks_task_names_at_most_its_first_machines() -> None:
    batch = [_ack(str(uuid.uuid4())) for _ in range(ACKS_SHOWN + 5)]
    shown = acks_repr(batch)
    assert shown.endswith(", and 5 more")
    assert str(json.loads(batch[ACKS_SHOWN - 1].raw)["machineId"]) in shown
    assert str(json.loads(batch[ACKS_SHOWN].raw)["machineId"]) not in shown


def test_hostile_fields_are_cut_in_what_flower_shows() -> None:
    shown = acks_repr([Inbound(json.dumps({"type": "x" * 1000, "machineId": "m" * 1000}))])
    assert len(shown) < 200


def test_an_enter_state_task_names_type_machine_state_and_attempt() -> None:
    machine = uuid.uuid4()
    step = Step(machine, 2, 0.0, "INVESTIGATE", "cto_fix_bug")
    assert step_repr(step) == f"cto_fix_bug {machine} state=INVESTIGATE attempt=2"
