"""Queues per workload: FSM_QUEUES read and checked; a machine type's queue (a child's own,
else its root's, else FSM_QUEUE); the bridge's relay splitting a batch by its machines' queues
(those it cannot route on FSM_QUEUE)."""

from __future__ import annotations

import json

import pytest
import sqlalchemy.exc
from pydantic import ValidationError

from fsm_celery.acks.consumer import Envelope
from fsm_celery.acks.relay import Relay, machine_id_in
from fsm_celery.config import Settings
from fsm_celery.engine.ports import Inbound

A = "3f2b8c1e-5d4a-4e8b-9c7d-2a1b0c9d8e7f"
B = "9a0d11c4-5d4a-4e8b-9c7d-2a1b0c9d8e7f"


def test_a_machine_types_queue() -> None:
    settings = Settings(
        queue="fsm",
        queues={"research_fanout": "fsm.research", "research_fanout.RESEARCHING": "fsm.web"},
    )
    assert settings.queue_for("research_fanout") == "fsm.research"
    assert settings.queue_for("research_fanout.ANALYZING") == "fsm.research"  # its root's
    assert settings.queue_for("research_fanout.RESEARCHING") == "fsm.web"  # its own
    assert settings.queue_for("cto_fix_bug") == "fsm"
    assert settings.work_queues == ["fsm", "fsm.research", "fsm.web"]
    assert Settings(queue="fsm").work_queues == ["fsm"]


@pytest.mark.parametrize(
    ("queues", "problem"),
    [
        ({"not a type": "q"}, "is not a machine type"),
        ({"cto_fix_bug": "no spaces"}, "is not a queue name"),
        ({"cto_fix_bug": ""}, "is not a queue name"),
    ],
)
def test_bad_queues_are_refused_saying_why(queues: dict[str, str], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        Settings(queues=queues)


def _envelope(raw: str) -> Envelope:
    return Envelope(Inbound(raw, None), "stream")


def test_the_relay_splits_a_batch_by_its_machines_queues() -> None:
    asked: list[set[str]] = []

    def route(ids: set[str]) -> dict[str, str]:
        asked.append(ids)
        return {A: "fsm.research"}

    relay = Relay(app=None, queue="fsm", max_bytes=1 << 20, route=route)
    batch = [
        _envelope(f'{{"type": "state_ack", "machineId": "{A}"}}'),
        _envelope(f'{{"machineId" : "{B.upper()}", "state": "X"}}'),
        _envelope("not json at all"),
        _envelope(f'{{"type": "state_ack", "machineId": "{A}", "attempt": 2}}'),
    ]
    parts = dict(relay._by_queue(batch))
    assert asked == [{A, B}]
    assert [d.item.raw for d in parts["fsm.research"]] == [batch[0].item.raw, batch[3].item.raw]
    assert [d.item.raw for d in parts["fsm"]] == [batch[1].item.raw, batch[2].item.raw]
    assert machine_id_in("{}") is None
    assert Relay(app=None, queue="fsm", max_bytes=1)._by_queue(batch) == [("fsm", batch)]


STATUS = json.dumps({"type": "agent_status", "agentId": A, "agentType": "cto", "status": "active"})


def test_the_relay_applies_agents_statuses_itself_and_relays_the_rest() -> None:
    applied: list[str] = []

    def statuses(batch: list[Envelope]) -> list[Envelope]:
        applied.extend(d.item.raw for d in batch)
        return []

    relay = Relay(app=None, queue="fsm", max_bytes=1 << 20, statuses=statuses)
    ack = f'{{"type": "state_ack", "machineId": "{A}", "output": {{"type": "agent_status"}}}}'
    batch = [_envelope(STATUS), _envelope(ack), _envelope('{"type": "agent_status"' + " " * 5000)]
    failed, rest = relay._apply_statuses(batch)
    assert (failed, applied) == ([], [STATUS])
    assert rest == batch[1:]  # an ack that names the type inside, and no JSON at all: relayed


def test_the_relay_relays_statuses_when_the_database_is_away() -> None:
    def away(batch: list[Envelope]) -> list[Envelope]:
        raise sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))

    relay = Relay(app=None, queue="fsm", max_bytes=1 << 20, statuses=away)
    batch = [_envelope(STATUS), _envelope(f'{{"type": "state_ack", "machineId": "{A}"}}')]
    assert relay._apply_statuses(batch) == ([], batch)  # nothing waits for the database
