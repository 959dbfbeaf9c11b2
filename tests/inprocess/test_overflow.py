"""One machine the database refuses to write holds back no other: what would not fit is refused
alone before anything is sent; the scan goes on machine by machine past a write the database
refuses, and a state_task its failed try sent is recorded, never sent twice (issue 23: 13, 15).
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from fsm_celery.core.admin import Action, Command
from fsm_celery.exceptions import CommandRefused
from fsm_celery.store import queries as q
from tests.inprocess.conftest import Fsm, ack


def _refuse_timeouts_of(fsm: Fsm, machine_id: uuid.UUID) -> None:
    with fsm.engine.db.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION refuse_timeout() RETURNS trigger AS $$ BEGIN "
            f"IF NEW.machine_id = '{machine_id}' AND NEW.event = 'timeout' THEN "
            "RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER refuse_timeout BEFORE INSERT ON state_transitions "
            "FOR EACH ROW EXECUTE FUNCTION refuse_timeout()"
        )


def _allow_timeouts(fsm: Fsm) -> None:
    with fsm.engine.db.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER refuse_timeout ON state_transitions")
        conn.exec_driver_sql("DROP FUNCTION refuse_timeout()")


def test_the_scan_goes_on_past_a_machine_whose_write_the_database_refuses(fsm: Fsm) -> None:
    agent = fsm.agent("tester")
    refused, other = (fsm.start("test_timeout", {"who": "the oracle"}) for _ in range(2))
    assert len(agent.tasks()) == 2
    _refuse_timeouts_of(fsm, refused)
    fsm.clock.advance(1.1)
    fsm.scan()
    assert [h.event for h in fsm.history(other)] == ["start", "timeout"]
    assert fsm.machine(refused).attempt == 1  # not written: tried again by the next scan
    _allow_timeouts(fsm)
    fsm.scan()
    assert [h.event for h in fsm.history(refused)] == ["start", "timeout"]
    sent = Counter((t["machineId"], t["attempt"]) for t in [*agent.seen, *agent.tasks()])
    assert sent == {(str(m), a): 1 for m in (refused, other) for a in (1, 2)}  # each once


def test_a_command_whose_history_row_would_not_fit_is_refused_before_anything_is_sent(
    fsm: Fsm,
) -> None:
    agent = fsm.agent("tester")
    mid = fsm.start("test_pair")
    [first] = agent.tasks()
    force = Command(Action.FORCE, "op", "because\x00", target="SECOND")
    with pytest.raises(CommandRefused, match="reason holds a NUL character"):
        fsm.engine.admin.command(mid, force)
    assert agent.tasks() == []  # SECOND was not sent
    machine = fsm.machine(mid)
    assert (machine.current_state, machine.attempt) == ("FIRST", first["attempt"])


def test_an_ack_past_its_machines_totals_is_refused_alone_in_its_batch(fsm: Fsm) -> None:
    agent = fsm.agent("tester")
    greedy, honest = fsm.start("test_pair"), fsm.start("test_pair")
    tasks = {t["machineId"]: t for t in agent.tasks()}
    over = ack(tasks[str(greedy)], output={"first": 1, "tokensUsed": 2**63 - 1})
    fsm.receive(over, ack(tasks[str(honest)]))
    assert fsm.rejections(greedy) == ["invalid_value"]
    assert fsm.machine(greedy).attempt == 1 and fsm.machine(honest).current_state == "SECOND"
    assert [t["machineId"] for t in agent.tasks()] == [str(honest)]


def test_an_entry_tried_again_after_its_write_failed_sends_its_state_task_once(fsm: Fsm) -> None:
    """fsm.enter_state sends, then writes and commits; a commit that fails (PostgreSQL
    restarting) has the task run again, which records the dispatch its failed try sent."""
    agent = fsm.agent("tester")
    [first] = fsm.engine.admin.start("test_pair", {}).next
    with fsm.engine.db.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION refuse_entry() RETURNS trigger AS $$ BEGIN "
            "RAISE EXCEPTION 'refused'; END $$ LANGUAGE plpgsql"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER refuse_entry BEFORE UPDATE ON state_machines FOR EACH ROW "
            f"WHEN (NEW.id = '{first.machine_id}' AND NEW.entered_at IS NOT NULL) "
            "EXECUTE FUNCTION refuse_entry()"
        )
    with pytest.raises(Exception, match="refused"):
        fsm.engine.entry.enter(first.machine_id, first.attempt)
    with fsm.engine.db.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER refuse_entry ON state_machines")
        conn.exec_driver_sql("DROP FUNCTION refuse_entry()")
    fsm.engine.entry.enter(first.machine_id, first.attempt)  # the task, run again
    assert [(t["machineId"], t["attempt"]) for t in agent.tasks()] == [
        (str(first.machine_id), first.attempt)
    ]
    with fsm.engine.db.connect() as conn:
        row = q.get_machine_txn(conn, first.machine_id)
    assert row is not None and row.dispatch_due_at is None  # recorded as sent
