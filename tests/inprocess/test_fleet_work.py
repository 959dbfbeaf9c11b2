"""The dashboard's fsm_work_waiting (the FsmNoLiveAgent alert's measure) counts what waits on
an agent only: a machine at an approval gate, waiting for an event or for a tool's call waits
on no agent, and must not make an agent type look starved (real PostgreSQL and Redis)."""

from __future__ import annotations

from datetime import UTC, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from fsm_celery.http import fleet_queries as fq
from fsm_celery.http.fleet import Fleet
from fsm_celery.store.tables import approval_gates
from fsm_celery.worker.broker import RedisQueues
from tests.inprocess.conftest import Fsm, ack

CONTEXT = {"projectName": "p", "githubIssue": 1, "key": "k"}


def work_waiting(fsm: Fsm) -> dict[str, float]:
    fleet = Fleet(fsm.settings, fsm.engine.db, fsm.redis, RedisQueues(fsm.redis))
    found: dict[str, float] = {}
    for family in fleet.collect():
        for sample in family.samples:
            if sample.name == "fsm_work_waiting":
                found[sample.labels["agent_type"]] = sample.value
    return found


def _answer_first(fsm: Fsm, **reply: Any) -> None:
    fsm.receive(ack(fsm.agent("tester").tasks()[-1], **reply))


def test_a_gate_a_wait_and_a_tool_call_are_no_agents_work(fsm: Fsm) -> None:
    fsm.engine.runtime.caller = lambda calls: None  # the tool call's task: none sent here
    gate = fsm.start("test_gate")
    _answer_first(fsm)
    waiting = fsm.start("test_wait")
    _answer_first(fsm)
    fsm.start("test_tool", CONTEXT)
    assert fsm.machine(gate).current_state == "REVIEW"
    assert fsm.machine(waiting).current_state == "WAIT_MERGE"
    assert work_waiting(fsm).get("tester", 0) == 0
    fsm.start("test_linear")  # a state_task sent to the tester type: its work
    assert work_waiting(fsm)["tester"] == 1


@pytest.mark.parametrize("database", ["fsm", "fsm_sqlite"])
def test_open_gates_are_counted_and_past_their_share_of_time(
    database: str, request: pytest.FixtureRequest
) -> None:
    """fsm_approvals_waiting and fsm_approvals_past_sla's counts (in SQL on PostgreSQL, in
    Python on SQLite): a gate of an hour, half an hour in, is past 40% of its time, not 60%."""
    fsm: Fsm = request.getfixturevalue(database)
    fsm.start("test_gate")
    _answer_first(fsm)
    with fsm.engine.db.connect() as conn:
        opened = conn.execute(select(approval_gates.c.opened_at)).scalar_one()
        half = (opened if opened.tzinfo else opened.replace(tzinfo=UTC)) + timedelta(minutes=30)
        assert fq.open_gates_txn(conn, half, 0.4) == ({"test_gate": 1}, {"test_gate": 1})
        assert fq.open_gates_txn(conn, half, 0.6) == ({"test_gate": 1}, {"test_gate": 0})
