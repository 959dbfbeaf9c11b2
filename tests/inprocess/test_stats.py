"""Statistics: counters folded from the history once, plus the tail not folded yet; exact
counts, percentiles within a bucket's width, and no row counted twice or skipped when ids
commit out of order."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import create_engine, insert, text

from fsm_celery.core.stats import GROWTH
from fsm_celery.store.tables import transitions
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
    late.execute(insert(transitions).values(**_attempt_row(mid, 100)))  # takes its id now
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


def _attempt_row(machine_id: uuid.UUID, attempt: int) -> dict[str, Any]:
    return {
        "machine_id": machine_id,
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
