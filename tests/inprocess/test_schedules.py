"""Schedules against real PostgreSQL: ticks, missed ticks, overlap, two beats, operators."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from fsm_celery import wiring
from fsm_celery.core.admin import Action, Command
from fsm_celery.core.loader import parse_definition
from fsm_celery.engine import MachineEngine
from fsm_celery.engine.schedules import ScheduleInfo
from fsm_celery.exceptions import InvalidActor, ScheduleNotFound
from fsm_celery.store.tables import machines, schedule_runs
from tests.inprocess.conftest import Fsm

T0 = datetime(2026, 3, 2, 12, 5, 0, tzinfo=UTC)


def _definition(*schedules: dict[str, Any], machine_type: str = "sched_round") -> Any:
    return parse_definition(
        {
            "type": machine_type,
            "agent_type": "tester",
            "initial_state": "WORK",
            "schedules": list(schedules),
            "states": [
                {
                    "name": "WORK",
                    "required_output": ["done"],
                    "on_success": "DONE",
                    "on_failure": "FAILED",
                },
                {"name": "DONE", "terminal": "completed"},
                {"name": "FAILED", "terminal": "failed"},
            ],
        }
    )


def _load(fsm: Fsm, *schedules: dict[str, Any], machine_type: str = "sched_round") -> None:
    fsm.engine.catalog.load([_definition(*schedules, machine_type=machine_type)])


def _ours(fsm: Fsm) -> list[ScheduleInfo]:
    """The test's schedules (the shipped definitions have theirs)."""
    return [i for i in fsm.engine.schedules.all() if i.machine_type.startswith("sched_")]


def _runs(fsm: Fsm) -> list[tuple[datetime, str]]:
    with fsm.engine.db.connect() as conn:
        rows = conn.execute(schedule_runs.select().order_by(schedule_runs.c.tick_at)).all()
    return [(r.tick_at, r.outcome) for r in rows]


def _machine_count(fsm: Fsm) -> int:
    with fsm.engine.db.connect() as conn:
        return len(conn.execute(machines.select().where(machines.c.type == "sched_round")).all())


def _at(fsm: Fsm, when: datetime) -> None:
    fsm.clock.now = when


def test_a_tick_starts_one_machine_and_missed_ticks_run_once(fsm: Fsm) -> None:
    _at(fsm, T0)
    _load(fsm, {"cron": "*/10 * * * *", "overlap": "allow", "context": {"region": "eu"}})
    [info] = _ours(fsm)
    assert info.key == "sched_round/default"
    assert info.next_run_at == datetime(2026, 3, 2, 12, 10, tzinfo=UTC)

    _at(fsm, datetime(2026, 3, 2, 12, 9, 59, tzinfo=UTC))
    assert fsm.engine.schedules.run() == (0, [])
    _at(fsm, datetime(2026, 3, 2, 12, 10, 0, 300_000, tzinfo=UTC))
    due, [step] = fsm.engine.schedules.run()
    assert due == 1 and step.state == "WORK"
    assert fsm.machine(step.machine_id).context["region"] == "eu"
    assert fsm.engine.schedules.run() == (0, [])  # the same tick again: nothing

    # beat was down for an hour and a half: one machine, for the latest tick
    _at(fsm, datetime(2026, 3, 2, 13, 47, tzinfo=UTC))
    due, started = fsm.engine.schedules.run()
    assert due == 1 and len(started) == 1
    assert _runs(fsm) == [
        (datetime(2026, 3, 2, 12, 10, tzinfo=UTC), "started"),
        (datetime(2026, 3, 2, 13, 40, tzinfo=UTC), "started"),
    ]
    [info] = _ours(fsm)
    assert info.next_run_at == datetime(2026, 3, 2, 13, 50, tzinfo=UTC)
    assert info.last_machine_id == started[0].machine_id


def test_skip_starts_none_while_the_previous_machine_runs(fsm: Fsm) -> None:
    _at(fsm, T0)
    _load(fsm, {"cron": "* * * * *"})  # overlap: skip, the default
    _at(fsm, datetime(2026, 3, 2, 12, 6, tzinfo=UTC))
    _, [first] = fsm.engine.schedules.run()
    fsm.enter_all([first])
    _at(fsm, datetime(2026, 3, 2, 12, 7, tzinfo=UTC))
    assert fsm.engine.schedules.run() == (1, [])  # the first still runs
    [info] = _ours(fsm)
    assert info.last_outcome == "skipped" and str(first.machine_id) in (info.last_detail or "")

    fsm.engine.admin.command(first.machine_id, Command(Action.CANCEL, "test", ""))
    _at(fsm, datetime(2026, 3, 2, 12, 8, tzinfo=UTC))
    _, [second] = fsm.engine.schedules.run()  # the previous one ended: a new round
    assert second.machine_id != first.machine_id
    assert [outcome for _, outcome in _runs(fsm)] == ["started", "skipped", "started"]


def test_two_beats_start_one_machine_per_tick(fsm: Fsm) -> None:
    """Two engines (two beats' workers) race for every tick of a one-second schedule."""
    _at(fsm, T0)
    _load(fsm, {"cron": "* * * * * *", "overlap": "allow"})
    other = wiring.machine_engine(fsm.settings, clock=fsm.clock)
    try:
        for second in range(1, 11):
            _at(fsm, T0.replace(second=second, microsecond=100_000))
            _race(fsm.engine, other)
        assert _machine_count(fsm) == 10
        assert len(_runs(fsm)) == 10
    finally:
        other.db.dispose()


def _race(*engines: MachineEngine) -> None:
    barrier = threading.Barrier(len(engines))
    errors: list[BaseException] = []

    def run(engine: MachineEngine) -> None:
        try:
            barrier.wait()
            engine.schedules.run()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors, errors


def test_operators_pause_resume_and_trigger_and_each_change_is_audited(fsm: Fsm) -> None:
    _at(fsm, T0)
    _load(fsm, {"name": "hourly", "cron": "0 * * * *", "overlap": "allow"})
    schedules = fsm.engine.schedules
    assert schedules.pause("sched_round/hourly", "alice", "maintenance window").paused

    _at(fsm, datetime(2026, 3, 2, 15, 30, tzinfo=UTC))
    assert schedules.run() == (0, [])  # paused: its ticks start nothing
    [machine] = schedules.trigger("sched_round", "bob", "check now")  # TYPE alone: its one
    assert fsm.machine(machine.machine_id).status == "running"
    latest = schedules.one("sched_round")
    assert (latest.last_outcome, latest.last_machine_id) == ("started", machine.machine_id)
    assert latest.last_run_at == datetime(2026, 3, 2, 15, 30, tzinfo=UTC)  # the trigger's

    info = schedules.resume("sched_round/hourly", "alice")
    assert not info.paused
    assert info.next_run_at == datetime(2026, 3, 2, 16, 0, tzinfo=UTC)  # no burst of the paused

    _load(fsm, {"name": "hourly", "cron": "0 * * * *", "overlap": "allow"})  # a reload
    runs, events = schedules.history("sched_round/hourly")
    assert [(e.action, e.actor, e.reason) for e in reversed(events)] == [
        ("created", "definitions load", ""),
        ("pause", "alice", "maintenance window"),
        ("trigger", "bob", "check now"),
        ("resume", "alice", ""),
    ]
    assert [(r.outcome, r.actor, r.machine_id) for r in runs] == [
        ("started", "bob", machine.machine_id)
    ]


def test_a_paused_schedule_stays_paused_across_loads_and_a_dropped_one_retires(fsm: Fsm) -> None:
    _at(fsm, T0)
    _load(fsm, {"name": "a", "cron": "0 * * * *"}, {"name": "b", "cron": "30 * * * *"})
    fsm.engine.schedules.pause("sched_round/a", "alice")
    _load(fsm, {"name": "a", "cron": "15 * * * *"})  # a changed, b dropped
    infos = {i.name: i for i in fsm.engine.schedules.all()}
    assert infos["a"].paused and infos["a"].cron == "15 * * * *"
    assert infos["a"].next_run_at == datetime(2026, 3, 2, 12, 15, tzinfo=UTC)
    assert infos["b"].removed
    _at(fsm, datetime(2026, 3, 2, 14, 0, tzinfo=UTC))
    assert fsm.engine.schedules.run() == (0, [])  # a paused, b retired


def test_a_schedule_that_cannot_start_its_machine_fails_alone(fsm: Fsm) -> None:
    _at(fsm, T0)
    _load(fsm, {"cron": "* * * * *", "context": {"retryCount": "many"}})  # refused at start
    _load(fsm, {"cron": "* * * * *", "overlap": "allow"}, machine_type="sched_other")
    _at(fsm, datetime(2026, 3, 2, 12, 6, tzinfo=UTC))
    due, started = fsm.engine.schedules.run()
    assert due == 2 and len(started) == 1
    infos = {i.machine_type: i for i in fsm.engine.schedules.all()}
    assert infos["sched_round"].last_outcome == "failed"
    assert "retryCount" in (infos["sched_round"].last_detail or "")
    assert infos["sched_other"].last_outcome == "started"


def test_bad_references_and_actors_are_refused_with_the_choices(fsm: Fsm) -> None:
    _at(fsm, T0)
    _load(fsm, {"name": "a", "cron": "0 * * * *"}, {"name": "b", "cron": "30 * * * *"})
    with pytest.raises(ScheduleNotFound, match="sched_round/a, sched_round/b"):
        fsm.engine.schedules.trigger("sched_round", "alice")  # two: which one?
    with pytest.raises(ScheduleNotFound, match="no schedule 'nope/x'"):
        fsm.engine.schedules.pause("nope/x", "alice")
    with pytest.raises(InvalidActor, match="at most 100"):
        fsm.engine.schedules.pause("sched_round/a", "x" * 101)
    assert not any(i.paused for i in fsm.engine.schedules.all())


def test_the_scan_and_the_schedules_record_when_they_last_ran(fsm: Fsm) -> None:
    from fsm_celery.store import schedules as schedule_store

    _at(fsm, T0)
    fsm.scan()
    fsm.engine.schedules.run()
    with fsm.engine.db.connect() as conn:
        assert schedule_store.last_run_txn(conn, "scan") == T0
        assert schedule_store.last_run_txn(conn, "schedules") == T0
