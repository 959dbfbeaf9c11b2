"""Statistics: counters folded from the history once, plus the tail not folded yet; exact
counts, percentiles within a bucket's width, and no row counted twice or skipped when ids
commit out of order."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import create_engine, delete, func, insert, select, text

from fsm_celery.core.admin import Action, Command
from fsm_celery.core.stats import GROWTH
from fsm_celery.store import reads, rollup
from fsm_celery.store.reads import MachineFilter
from fsm_celery.store.tables import machine_count_changes, machine_counts, machines, transitions
from tests.inprocess.conftest import Fsm, ack
from tests.support.messages import FIX_BUG_STATES, OUTPUTS
from tests.support.services import Services

CONTEXT = {"projectName": "sla-api", "githubIssue": 7, "bugDescription": "login fails"}


def _run(fsm: Fsm, seconds_per_state: float, fail_first: bool = False) -> uuid.UUID:
    agent_id = uuid.uuid4()
    agent = fsm.agent(str(agent_id))
    mid = fsm.start("cto_fix_bug", CONTEXT, agent_id=agent_id)
    failed = not fail_first
    while (tasks := agent.tasks()) and fsm.machine(mid).status == "running":
        fsm.clock.advance(seconds_per_state)
        if not failed:
            failed = True
            fsm.receive(ack(tasks[0], success=False, error="flaky"))
            fsm.enter_all(fsm.scan())
            fsm.clock.advance(60)  # past the retry's backoff
            fsm.enter_all(fsm.scan())
            continue
        fsm.receive(ack(tasks[0]))
    return mid


def _attempts(stats: dict[str, Any]) -> int:
    return sum(s["attempts"] for states in stats["states"].values() for s in states.values())


def test_stats_count_every_attempt_whether_folded_or_not(fsm: Fsm) -> None:
    for _ in range(3):
        _run(fsm, 0.2)
    unfolded = fsm.engine.stats.read()
    states = len(FIX_BUG_STATES) - 1
    assert _attempts(unfolded) == 3 * states and unfolded["as_of"]["unfolded"] == 3 * states

    fsm.engine.stats.fold()  # notes where it may fold to
    fsm.clock.advance(2)
    assert fsm.engine.stats.fold() == 3 * states
    assert fsm.engine.stats.fold() == 0  # nothing twice
    folded = fsm.engine.stats.read()
    assert folded["as_of"]["unfolded"] == 0 and folded["as_of"]["folded_through"] > 0
    assert folded["states"] == unfolded["states"]  # the same figures, from counters
    assert folded["machines"]["cto_fix_bug"] == {"completed": 3}
    assert folded["by_status"]["completed"] == 3 and folded["by_agent_type"]["cto"] == 3
    assert folded["completion_rate"]["cto_fix_bug"] == 1.0


def test_durations_are_read_to_within_a_bucket(fsm: Fsm) -> None:
    _run(fsm, 0.4)
    _run(fsm, 0.4)
    write_fix = fsm.engine.stats.read()["states"]["cto_fix_bug"]["WRITE_FIX"]
    assert write_fix["attempts"] == 2 and write_fix["success_rate"] == 1.0
    assert write_fix["mean_ms"] == 400.0
    assert 400 / GROWTH <= write_fix["p50_ms"] <= 400 * GROWTH
    assert 400 / GROWTH <= write_fix["p95_ms"] <= 400 * GROWTH


def test_a_failed_attempt_lowers_its_states_success_rate(fsm: Fsm) -> None:
    _run(fsm, 0.1, fail_first=True)
    first = fsm.engine.stats.read()["states"]["cto_fix_bug"]["ANALYZE_BUG"]
    assert (first["attempts"], first["success_rate"]) == (2, 0.5)


def test_a_row_that_commits_after_a_larger_id_was_seen_is_still_folded(fsm: Fsm) -> None:
    mid = _run(fsm, 0.1)
    late = fsm.engine.db.connect()
    late_tx = late.begin()
    late.execute(insert(transitions).values(**_attempt_row(fsm, mid, 100)))  # takes its id now
    _run(fsm, 0.1)  # larger ids, committed first
    stats = fsm.engine.stats
    stats.fold()  # notes the largest id, with the late transaction in flight
    fsm.clock.advance(2)
    assert stats.fold() == 0  # it waits for the late transaction to end
    late_tx.commit()
    late.close()
    before = _attempts(stats.read())
    stats.fold()
    fsm.clock.advance(2)
    stats.fold()
    after = stats.read()
    assert after["as_of"]["unfolded"] == 0
    assert _attempts(after) == before == 2 * (len(FIX_BUG_STATES) - 1) + 1


def test_usage_is_summed_per_agent_and_type(fsm: Fsm) -> None:
    agent_id = uuid.uuid4()
    agent = fsm.agent(str(agent_id))
    mid = fsm.start("cto_fix_bug", CONTEXT, agent_id=agent_id)
    while (tasks := agent.tasks()) and fsm.machine(mid).status == "running":
        output = {**OUTPUTS.get(tasks[0]["state"], {}), "tokensUsed": 10, "cost": 0.5}
        fsm.receive(ack(tasks[0], output=output))
    usage = fsm.engine.stats.read()["usage"]
    attempts = len(FIX_BUG_STATES) - 1
    assert usage["by_agent"][str(agent_id)] == {
        "tokens": 10 * attempts,
        "cost": 0.5 * attempts,
        "attempts": attempts,
    }
    assert usage["by_type"]["cto_fix_bug"]["tokens"] == 10 * attempts


def _attempt_row(fsm: Fsm, machine_id: uuid.UUID, attempt: int) -> dict[str, Any]:
    with fsm.engine.db.connect() as conn:
        created = conn.execute(
            select(machines.c.created_at).where(machines.c.id == machine_id)
        ).scalar_one()
    return {
        "machine_id": machine_id,
        "machine_created_at": created,
        "from_state": "WRITE_FIX",
        "to_state": "RUN_TESTS",
        "success": True,
        "attempt": attempt,
        "event": "ack",
        "duration_ms": 5,
    }


def test_a_transaction_in_another_database_does_not_hold_the_fold_back(
    fsm: Fsm, services: Services
) -> None:
    stats = fsm.engine.stats
    other = create_engine(f"{services.pg_url}/postgres")
    try:
        with other.connect() as conn, conn.begin():
            conn.execute(text("SELECT pg_current_xact_id()"))  # takes a transaction id
            stats.fold()
            fsm.clock.advance(2)
            stats.fold()  # notes where to fold to, the other database's transaction in flight
            _run(fsm, 0.1)
            fsm.clock.advance(2)
            stats.fold()
            fsm.clock.advance(2)
            assert stats.fold() == len(FIX_BUG_STATES) - 1
            assert stats.read()["as_of"]["unfolded"] == 0
    finally:
        other.dispose()


def _truth(fsm: Fsm) -> dict[tuple[str, str, str], tuple[int, int, float]]:
    """Machines by type, agent type and status, counted from every machine row."""
    m = machines.c
    with fsm.engine.db.connect() as conn:
        rows = conn.execute(
            select(
                m.type,
                m.agent_type,
                m.status,
                func.count(),
                func.sum(m.tokens_used),
                func.sum(m.cost),
            ).group_by(m.type, m.agent_type, m.status)
        ).all()
    return {(t, a, s): (n, int(tokens), float(cost)) for t, a, s, n, tokens, cost in rows}


def _counted(fsm: Fsm) -> dict[tuple[str, str, str], tuple[int, int, float]]:
    """The same, as the statistics count them (live rows, folded counters, changes)."""
    with fsm.engine.db.connect() as conn:
        counts = rollup.machine_counts_txn(conn)
    return {(c.type, c.agent_type, c.status): (c.total, c.tokens, c.cost) for c in counts}


@pytest.mark.parametrize("database", ["fsm", "fsm_sqlite"])
def test_machines_are_counted_exactly_live_or_finished_folded_or_not_run_again_or_deleted(
    database: str, request: pytest.FixtureRequest
) -> None:
    """Counted by the triggers' changes and the fold alone (no machine row read): a start, a
    transition with usage while running, a finish, a cancel, a pause, a retry, a delete."""
    fsm: Fsm = request.getfixturevalue(database)
    agent = fsm.agent("tester")
    mids = [fsm.start("test_linear") for _ in range(5)]
    for n in range(3):  # each state of the first two, with usage; the 4th's first state too
        for task in agent.tasks():
            mid = uuid.UUID(task["machineId"])
            if mid in mids[:2] or (mid == mids[3] and n == 0):
                output = {task["state"].lower(): 1, "tokensUsed": 7, "cost": 0.25}
                fsm.receive(ack(task, output=output))
    admin = fsm.engine.admin
    admin.command(mids[2], Command(Action.CANCEL, "ops", "not needed"))
    admin.command(mids[4], Command(Action.PAUSE, "ops", "a look first"))
    assert [fsm.machine(m).status for m in mids] == [
        "completed",
        "completed",
        "cancelled",
        "running",
        "paused",
    ]
    assert fsm.machine(mids[3]).tokens_used == 7  # usage while running: a change of its own
    assert _counted(fsm) == _truth(fsm)  # every change not folded yet
    with fsm.engine.db.begin() as conn:  # a backlog is folded a chunk at a time, oldest first
        assert rollup.fold_machine_counts_txn(conn, most=2) == 2
    assert _counted(fsm) == _truth(fsm)
    fsm.engine.stats.fold()
    assert _counted(fsm) == _truth(fsm)
    with fsm.engine.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(machine_count_changes)).scalar() == 0
        assert conn.execute(select(func.sum(machine_counts.c.machines))).scalar() == 5
    admin.command(mids[4], Command(Action.RESUME, "ops", "looked"))
    fsm.enter_all(admin.command(mids[2], Command(Action.RETRY, "ops", "after all")))
    assert fsm.machine(mids[2]).status == "running"
    with fsm.engine.db.begin() as conn:  # as an operator (or a prune) deletes a finished one
        conn.execute(delete(transitions).where(transitions.c.machine_id == mids[0]))
        conn.execute(delete(machines).where(machines.c.id == mids[0]))
    assert _counted(fsm) == _truth(fsm)
    fsm.engine.stats.fold()
    assert _counted(fsm) == _truth(fsm)
    stats = fsm.engine.stats.read()
    assert stats["machines"]["test_linear"] == {"completed": 1, "running": 3}
    for where in (MachineFilter(machine_type="test_linear"), MachineFilter(status="running")):
        with fsm.engine.db.connect() as conn:  # by the counters
            counted = reads.count_machines_txn(conn, where)
        every = replace(where, created_after=datetime(2000, 1, 1, tzinfo=UTC))
        with fsm.engine.db.connect() as conn:  # by the machine rows
            assert counted == reads.count_machines_txn(conn, every)
        expected = {"completed": 1, "running": 3} if where.status is None else {"running": 3}
        assert counted == expected
    truth = _truth(fsm)  # the usage of the running machine with usage, and the completed one
    assert stats["usage"]["by_type"]["test_linear"]["tokens"] == 7 + 7 * 3
    assert stats["usage"]["by_type"]["test_linear"]["tokens"] == sum(
        tokens for (kind, _, _), (_, tokens, _) in truth.items() if kind == "test_linear"
    )


@pytest.mark.parametrize("database", ["fsm", "fsm_sqlite"])
def test_a_transition_from_state_to_state_changes_no_count(
    database: str, request: pytest.FixtureRequest
) -> None:
    """The hot path pays nothing for the counts: a machine moved on from state to state, with no
    usage reported, appends no change (its status, type and agent type stay); usage does."""
    fsm: Fsm = request.getfixturevalue(database)
    agent = fsm.agent("tester")
    mid = fsm.start("test_linear")
    fsm.engine.stats.fold()
    assert _changes(fsm) == 0
    (task,) = agent.tasks()
    fsm.receive(ack(task, output={task["state"].lower(): 1}))
    assert fsm.machine(mid).current_state != task["state"]
    assert fsm.machine(mid).status == "running"
    assert _changes(fsm) == 0
    (task,) = agent.tasks()
    fsm.receive(ack(task, output={task["state"].lower(): 1, "tokensUsed": 3}))
    assert _changes(fsm) == 1  # the usage, counted for the running machine


def _changes(fsm: Fsm) -> int:
    with fsm.engine.db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(machine_count_changes)).scalar())


def test_postgresql_sums_attempts_as_python_does(fsm: Fsm) -> None:
    """The read's and the fold's sums in SQL (PostgreSQL) give what summing the rows gives."""
    mid = _run(fsm, 0.2, fail_first=True)
    durations = [None, 0, 1, 2, 3, 5, 999, 1000, 123_456, 10**12, 2**62]
    # per agent, costs within a row's bound, past it (stored before the bounds), and not finite
    costs = {
        uuid.uuid4(): [0.0, 0.25, 1e12],
        uuid.uuid4(): [0.5, 1e300, 2.5],
        uuid.uuid4(): [1.0, float("inf")],
        uuid.uuid4(): [float("nan"), 1.0],
        uuid.uuid4(): [1.7e308, 1.7e308],
    }
    with fsm.engine.db.begin() as conn:
        conn.execute(
            insert(transitions),
            [
                {**_attempt_row(fsm, mid, 100 + n), "duration_ms": ms, "success": n % 2 == 0}
                | {"agent_id": None, "cost": 0.0}
                for n, ms in enumerate(durations)
            ]
            + [
                {**_attempt_row(fsm, mid, 200 + n), "agent_id": agent, "cost": cost}
                for n, (agent, cost) in enumerate(
                    (agent, cost) for agent, spent in costs.items() for cost in spent
                )
            ],
        )
    with fsm.engine.db.connect() as conn:
        summed = rollup.summed_attempts_txn(conn, 0, None, 1000)
        rows = rollup.attempts_txn(conn, 0, None, 1000)
    assert summed.attempts == len(rows) and summed.last_id == rows[-1].id
    assert sorted(summed.by_state) == sorted(rollup.by_state(rows))
    python = {agent: (n, tokens, cost) for agent, n, tokens, cost in rollup.by_agent(rows)}
    assert {agent: (n, tokens) for agent, n, tokens, _ in summed.by_agent} == {
        agent: (n, tokens) for agent, (n, tokens, _) in python.items()
    }
    assert set(costs) <= {agent for agent, _, _, _ in summed.by_agent}
    for agent, _, _, cost in summed.by_agent:  # an exact sum, a float sum: the same to a ulp
        assert cost == pytest.approx(python[agent][2])
