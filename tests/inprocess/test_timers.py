"""The scan's timers (machine_timers, kept by triggers on state_machines) follow every machine
row that changes, and a transition updates its machine row in place (a HOT update)."""

from __future__ import annotations

import time
import uuid
from datetime import datetime
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import select, text

from fsm_celery.core.admin import Action, Command
from fsm_celery.store.tables import machine_timers, machines
from tests.inprocess.conftest import Fsm, ack

CONTEXT = {"projectName": "sla-api", "bugDescription": "login fails", "githubIssue": 7}


def timers(fsm: Fsm, mid: UUID) -> tuple[datetime | None, datetime | None] | None:
    """The machine's timer row (deadline, dispatch due), None if it has none."""
    t = machine_timers.c
    with fsm.engine.db.connect() as conn:
        row = conn.execute(
            select(t.deadline_at, t.dispatch_due_at).where(t.machine_id == mid)
        ).one_or_none()
    return None if row is None else (row.deadline_at, row.dispatch_due_at)


def on_machine(fsm: Fsm, mid: UUID) -> tuple[Any, Any]:
    """The machine row's own deadline and dispatch due time."""
    m = machines.c
    with fsm.engine.db.connect() as conn:
        row = conn.execute(select(m.deadline_at, m.dispatch_due_at).where(m.id == mid)).one()
    return (row.deadline_at, row.dispatch_due_at)


@pytest.mark.parametrize("database", ["fsm", "fsm_sqlite"])
def test_a_machines_timer_row_follows_its_deadline_and_goes_when_it_stops_running(
    database: str, request: pytest.FixtureRequest
) -> None:
    fsm: Fsm = request.getfixturevalue(database)
    agent = fsm.agent("tester")
    [first] = fsm.engine.admin.start("test_linear").next
    mid = first.machine_id
    deadline, due = on_machine(fsm, mid)
    assert deadline is None and due is not None  # stored due for dispatch
    assert timers(fsm, mid) == (None, due)
    fsm.engine.entry.enter(mid, first.attempt)
    deadline, due = on_machine(fsm, mid)
    assert deadline is not None and due is None  # dispatched: its deadline runs
    assert timers(fsm, mid) == (deadline, None)
    fsm.clock.advance(0.5)
    fsm.receive(ack(agent.task()))  # ONE -> TWO, entered at once
    assert agent.task()["state"] == "TWO"
    moved, _ = on_machine(fsm, mid)
    assert moved is not None and moved > deadline
    assert timers(fsm, mid) == (moved, None)
    fsm.engine.admin.command(mid, Command(Action.PAUSE, "ops", "look first"))
    assert timers(fsm, mid) is None  # not running: the scan has nothing to do with it
    fsm.enter_all(fsm.engine.admin.command(mid, Command(Action.RESUME, "ops", "go on")))
    again = agent.task()  # TWO again, a new attempt
    assert timers(fsm, mid) == on_machine(fsm, mid) != (None, None)
    fsm.receive(ack(again))  # TWO -> THREE
    fsm.receive(ack(agent.task()))  # THREE -> DONE
    assert fsm.machine(mid).status == "completed"
    assert timers(fsm, mid) is None


def test_a_transition_updates_its_machine_row_in_place(fsm: Fsm) -> None:
    """No column a transition changes is indexed on state_machines: PostgreSQL adds no index
    entries for it (a HOT update), which keeps a large table's writes cheap."""
    agent = fsm.agent(str(agent_id := uuid.uuid4()))
    before = updates(fsm)
    mid = fsm.start("cto_fix_bug", CONTEXT, agent_id=agent_id)
    while (task := agent.tasks()) and fsm.machine(mid).status == "running":
        fsm.clock.advance(0.25)
        fsm.receive(ack(task[0]))
    assert fsm.machine(mid).status == "completed"
    moves = len(fsm.history(mid)) - 1  # each an UPDATE of the machine row
    deadline = time.monotonic() + 10  # other backends report their counts within a second
    while (after := updates(fsm))[0] - before[0] < moves and time.monotonic() < deadline:
        time.sleep(0.2)
    done, hot = after[0] - before[0], after[1] - before[1]
    assert done >= moves, f"{done} updates of state_machines counted, {moves} expected"
    # all but the last, which ends the machine: its status is indexed
    assert hot == done - 1, f"{hot} of {done} updates of state_machines were HOT"


def updates(fsm: Fsm) -> tuple[int, int]:
    """state_machines' updates and HOT updates so far, as PostgreSQL counts them."""
    with fsm.engine.db.connect() as conn:
        row = conn.execute(
            text(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                " WHERE relname = 'state_machines'"
            )
        ).one()
    return int(row.n_tup_upd), int(row.n_tup_hot_upd)
