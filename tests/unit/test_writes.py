"""The typed write-set: its rows are the schema's columns, the statements each dialect builds
from them name exactly those columns, and `next()` is the one answer of every use case: the
states moved to and not entered in the transaction."""

from __future__ import annotations

import uuid
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Table
from sqlalchemy.dialects import sqlite as sqlite_dialect

from fsm_celery.core.clock import duration_ms
from fsm_celery.core.messages import StateTask
from fsm_celery.core.steps import Step
from fsm_celery.core.transition import MachineStatus, Transition
from fsm_celery.core.usage import Usage
from fsm_celery.exceptions import Unstorable
from fsm_celery.store import postgres, rows, sqlite
from fsm_celery.store.rows import (
    AgentReport,
    Beat,
    Dispatch,
    History,
    Move,
    NewMachine,
    Rejection,
    Row,
    columns,
)
from fsm_celery.store.sent import Sent
from fsm_celery.store.tables import agents, machines, rejected_messages, transitions
from fsm_celery.store.writes import Writes

NOW = datetime(2026, 1, 1, tzinfo=UTC)
TABLES: list[tuple[type[Row], Table]] = [
    (NewMachine, machines),
    (Move, machines),
    (Dispatch, machines),
    (Beat, machines),
    (History, transitions),
    (Rejection, rejected_messages),
    (AgentReport, agents),
]


@pytest.mark.parametrize(("kind", "table"), TABLES, ids=[k.__name__ for k, _ in TABLES])
def test_every_field_of_a_row_is_a_column_of_its_table(kind: type[Row], table: Table) -> None:
    assert set(columns(kind)) <= set(table.c.keys())
    required = {c.name for c in table.c if not c.nullable and c.server_default is None}
    if kind in (NewMachine, History, Rejection, AgentReport):  # inserts
        assert required - {"id"} <= set(columns(kind)), "an insert leaves a required column out"


@pytest.mark.parametrize("kind", [Move, Dispatch, Beat])
def test_rows_updated_by_id_have_it_first(kind: type[Row]) -> None:
    assert fields(kind)[0].name == "id"


@pytest.mark.parametrize("kind", [Move, Dispatch, Beat])
def test_each_dialect_updates_exactly_the_rows_fields(kind: type[Row]) -> None:
    names = columns(kind)
    pg = postgres._update(machines, names)
    assert pg.startswith("UPDATE state_machines AS t SET ")
    assert [s.split(" = ")[0] for s in pg.split(" SET ")[1].split(" FROM ")[0].split(", ")] == [
        *names[1:]
    ]
    lite = str(sqlite._update(machines, names).compile(dialect=sqlite_dialect.dialect()))
    sets = lite.split(" SET ")[1].split(" WHERE ")[0].split(", ")
    assert sorted(sets) == sorted(f"{n}=?" for n in names[1:])  # in the table's column order


def test_the_postgres_move_is_one_statement_over_both_tables() -> None:
    sql = postgres._move(columns(Move), columns(History))
    assert sql.startswith("WITH moved AS (UPDATE state_machines")
    assert f"INSERT INTO state_transitions ({', '.join(columns(History))})" in sql


def _row(**overrides: Any) -> Any:
    values = {
        "id": uuid.uuid4(),
        "type": "t",
        "agent_type": "worker",
        "github_issue": 12,
        "current_state": "A",
        "status": "running",
        "attempt": 1,
        "state_retries": 0,
        "context": {},
        "tokens_used": 0,
        "cost": 0.0,
        "budget_tokens": None,
        "budget_cost": None,
        "handbacks": 0,
        "corrections": 0,
        "entered_at": NOW,
        "created_at": NOW,
        "progress": None,
        "agent_id": None,
        "agent_pinned": False,
        "parent_id": None,
        "root_id": None,
    }
    return SimpleNamespace(**{**values, **overrides})


def _moved(row: Any, to: str, status: MachineStatus, delay: float = 0.0) -> Transition:
    return Transition(
        from_state=row.current_state,
        to_state=to,
        success=True,
        status=status,
        context={},
        attempt=row.attempt + 1,
        state_retries=0,
        output={},
        delay_seconds=delay,
    )


def test_next_holds_the_states_moved_to_and_not_entered() -> None:
    writes = Writes(NOW)
    entered, delayed, waiting, done = _row(), _row(), _row(), _row()
    writes.transition(entered, _moved(entered, "B", MachineStatus.RUNNING), "ack")
    writes.transition(delayed, _moved(delayed, "A", MachineStatus.RUNNING, delay=2.0), "ack")
    writes.transition(waiting, _moved(waiting, "C", MachineStatus.RUNNING), "ack")
    writes.transition(done, _moved(done, "END", MachineStatus.COMPLETED), "ack")
    assert writes.due_now() == [entered.id, waiting.id]
    writes.dispatch(_task(entered.id, 2, "B"), "agent", None)
    assert writes.due_now() == [waiting.id]
    assert writes.next() == [Step(delayed.id, 2, 2.0, "A", "t"), Step(waiting.id, 2, 0.0, "C", "t")]
    move = writes.moves[entered.id]
    assert (move.dispatch_due_at, move.entered_at, move.deadline_at) == (None, NOW, NOW)
    assert writes.dispatches == {}  # a machine moved and entered is written by one UPDATE
    assert [h.to_state for h in writes.history] == ["B", "A", "C", "END"]


def test_each_transition_queues_its_event_as_its_history_row_says() -> None:
    writes = Writes(NOW)
    row = _row(agent_id=uuid.uuid4())
    writes.transition(row, _moved(row, "END", MachineStatus.COMPLETED), "ack", actor="op")
    [event] = writes.out.events
    [history] = writes.history
    assert (event.machine_id, event.machine_type, event.agent_type, event.agent_id) == (
        row.id,
        "t",
        "worker",
        row.agent_id,
    )
    assert (event.from_state, event.to_state, event.status, event.attempt, event.event) == (
        "A",
        "END",
        "completed",
        history.attempt,
        "ack",
    )
    assert (event.actor, event.at, event.success, event.github_issue) == ("op", NOW, True, 12)
    assert '"fromState":"A"' in event.to_wire() and '"error":null' in event.to_wire()


def test_entering_a_machine_not_moved_records_a_dispatch_of_its_own() -> None:
    writes = Writes(NOW)
    row = _row(entered_at=None)
    task = _task(row.id, 1, "A")
    writes.dispatch(task, "agent", None)
    assert writes.dispatches[row.id] == Dispatch(row.id, None, NOW, NOW, NOW, None)
    assert writes.next() == [] and writes.out.to_send == [("agent", task.to_wire())]


def _task(machine_id: uuid.UUID, attempt: int, state: str) -> StateTask:
    return StateTask(
        machine_id=machine_id,
        machine_type="t",
        state=state,
        attempt=attempt,
        context={},
        prompt="",
        required_output=[],
        timeout=1000,
        deadline=NOW,
        task_token="token",
    )


def test_a_state_task_a_failed_transaction_sent_is_recorded_and_not_sent_again() -> None:
    sent = Sent()
    row = _row(entered_at=None)
    failed = Writes(NOW, sent=sent)
    failed.dispatch(_task(row.id, 1, "A"), "agent-1", None)
    sent.add(failed.out.sending)  # what send_and_write does once it sent them; then it rolled back
    again = Writes(NOW, sent=sent)
    assert again.sent_before(row.id, 1, "A") == "agent-1"
    again.dispatch(_task(row.id, 1, "A"), "agent-1", None)
    assert again.out.to_send == [] and row.id in again.dispatches  # recorded, not sent
    sent.forget(again.out.sending)  # committed
    assert sent.where((row.id, 1, "A")) is None


def test_the_memory_of_sent_state_tasks_is_bounded() -> None:
    sent = Sent(most=2)
    keys = [(uuid.uuid4(), 1, "A") for _ in range(3)]
    for key in keys:
        sent.add({key: "agent"})
    assert [sent.where(k) for k in keys] == [None, "agent", "agent"]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"attempt": 2**31 - 1}, "attempt 2147483648 does not fit its column"),
        ({"tokens_used": 2**63 - 1}, "tokens_used 9223372036854775808 does not fit"),
        ({"cost": 1.7e308}, "cost inf is not a finite number"),
    ],
    ids=["attempt", "tokens", "cost"],
)
def test_a_transition_whose_row_would_not_fit_is_refused_and_records_nothing(
    change: dict[str, Any], problem: str
) -> None:
    writes = Writes(NOW)
    row = _row(**change)
    moved = replace(
        _moved(row, "B", MachineStatus.RUNNING), usage=Usage(1 if "tokens_used" in change else 0)
    )
    if "cost" in change:
        moved = replace(moved, usage=Usage(0, 1.7e308))
    with pytest.raises(Unstorable, match=problem):
        writes.transition(row, moved, "ack")
    assert (writes.moves, writes.history, writes.out.events, writes.machines) == ({}, [], [], {})


def test_a_reason_with_a_nul_character_is_refused() -> None:
    writes = Writes(NOW)
    row = _row()
    with pytest.raises(Unstorable, match="reason holds a NUL"):
        writes.transition(row, _moved(row, "B", MachineStatus.PAUSED), "pause", reason="a\x00b")


def test_an_actor_longer_than_its_column_is_refused() -> None:
    writes = Writes(NOW)
    row = _row()
    with pytest.raises(Unstorable, match="actor is 101 characters long, over its column's 100"):
        writes.transition(row, _moved(row, "B", MachineStatus.PAUSED), "pause", actor="a" * 101)


def test_a_duration_is_kept_within_bigint() -> None:
    assert duration_ms(timedelta(days=30)) == 30 * 86_400_000  # past INTEGER's 24.8 days
    assert duration_ms(timedelta.max) < 2**63


@pytest.mark.parametrize(("kind", "table"), TABLES, ids=[k.__name__ for k, _ in TABLES])
def test_every_column_a_row_writes_knows_what_it_can_hold(kind: type[Row], table: Table) -> None:
    assert rows.TABLES[kind] is table


@pytest.mark.parametrize(
    ("status", "event", "timed"),
    [
        ("running", "ack", True),
        ("running", "pause", True),
        ("running", "force", True),
        ("completed", "force", False),
        ("failed", "retry", False),
        ("paused", "force", False),
        ("paused", "resume", False),
        ("paused", "cancel", False),
    ],
)
def test_only_a_running_state_is_timed(status: str, event: str, timed: bool) -> None:
    """Forcing a machine completed an hour ago does not record an hour in its last state."""
    writes = Writes(NOW)
    row = _row(status=status, entered_at=NOW - timedelta(hours=1))
    writes.transition(row, _moved(row, "B", MachineStatus.RUNNING), event, actor="op")
    [history] = writes.history
    assert history.duration_ms == (3_600_000 if timed else None)


def test_events_are_made_once_asked_for_and_an_event_that_fails_validation_is_still_made() -> None:
    """Events are made after the commit (out of the transaction's locks); a value the event's
    model refuses (a machine type that is not text, as no row holds) cannot lose the event of a
    transition that committed."""
    writes = Writes(NOW)
    row = _row()
    writes.transition(row, _moved(row, "END", MachineStatus.COMPLETED), "ack")
    assert writes.out.events is writes.out.events  # made once, kept
    odd = SimpleNamespace(**{**vars(row), "type": 42})
    writes.announce(writes.history[0], odd, "completed")  # type: ignore[arg-type]
    [first, second] = writes.out.events
    assert (first.machine_type, second.machine_type) == ("t", 42)
