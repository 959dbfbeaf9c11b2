"""A machine's context at every step, reconstructed from the changes its history records, is
the context the machine had after that step: through acks, a failure and its retry, a loop
back, an operator's force, an approval and an outside event (PostgreSQL and SQLite)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import func, select

from fsm_celery.core import timeline
from fsm_celery.core.admin import Action, Command
from fsm_celery.core.gate import Choice, Vote
from fsm_celery.store import queries as q
from fsm_celery.store.tables import machines
from tests.inprocess.conftest import Fsm, ack


def _reconstructed(fsm: Fsm, mid: UUID) -> list[dict[str, Any]]:
    with fsm.engine.db.connect() as conn:
        rows = q.history_txn(conn, mid)
    assert all(r.context_delta is not None for r in rows)
    return timeline.contexts(r.context_delta for r in rows)


def _step(fsm: Fsm, mid: UUID, seen: list[dict[str, Any]]) -> None:
    """Note the machine's context after the steps just taken (one per new history row)."""
    steps = len(fsm.history(mid))
    while len(seen) < steps - 1:  # a step that entered the next at once: not observable alone
        seen.append({})
    seen.append(dict(fsm.machine(mid).context))


@pytest.mark.parametrize("database", ["fsm", "fsm_sqlite"])
def test_every_steps_context_is_the_one_the_machine_had(
    database: str, request: pytest.FixtureRequest
) -> None:
    fsm: Fsm = request.getfixturevalue(database)
    agent = fsm.agent("tester")
    mid = fsm.start("test_gate", {"ticket": 7, "notes": ["a"]})
    seen: list[dict[str, Any]] = []
    _step(fsm, mid, seen)
    fsm.receive(ack(agent.task(), success=False, error="flaky"))  # BUILD fails: FAILED
    _step(fsm, mid, seen)
    fsm.enter_all(fsm.engine.admin.command(mid, Command(Action.RETRY, "ops", "again")))
    _step(fsm, mid, seen)
    fsm.receive(ack(agent.tasks()[-1], output={"built": "v1", "notes": ["a", "b"]}))
    _step(fsm, mid, seen)
    release = frozenset({"release"})
    from fsm_celery.engine.approvals import Authority

    vote = Vote("alice", Choice.REJECT, {}, "not yet")
    fsm.engine.approvals.decide(mid, vote, Authority(admin=False, groups=release))
    _step(fsm, mid, seen)  # back to BUILD, the loop counted
    fsm.receive(ack(agent.tasks()[-1], output={"built": "v2"}))
    _step(fsm, mid, seen)
    for who in ("alice", "bob"):
        vote = Vote(who, Choice.APPROVE, {"target": "staging"})
        fsm.engine.approvals.decide(mid, vote, Authority(admin=False, groups=release))
    _step(fsm, mid, seen)
    fsm.enter_all(fsm.engine.admin.command(mid, Command(Action.FORCE, "ops", target="DONE")))
    _step(fsm, mid, seen)
    found = _reconstructed(fsm, mid)
    assert len(found) == len(seen)
    for step, (mine, theirs) in enumerate(zip(found, seen, strict=True)):
        if theirs:
            assert timeline.same(mine, theirs), (step, mine, theirs)
    assert found[-1]["target"] == "staging" and found[-1]["built"] == "v2"
    assert found[-1]["retryCount"] == 1 and found[0]["notes"] == ["a"]


def test_rewind_puts_the_machine_back_with_that_steps_context_and_edits(fsm: Fsm) -> None:
    agent = fsm.agent("tester")
    mid = fsm.start("test_linear", {"ticket": 7})
    fsm.receive(ack(agent.task(), output={"one": 1, "draft": "first"}))  # step 1: ONE -> TWO
    fsm.receive(ack(agent.task(), output={"two": 2, "draft": "second"}))  # step 2: TWO -> THREE
    abandoned = agent.task()  # THREE's, in flight
    rewound = fsm.engine.rewind.rewind(mid, 1, "ops", "redo TWO with a fix", {"hint": "use v2"})
    fsm.enter_all(rewound.next)
    machine = fsm.machine(mid)
    assert (machine.current_state, machine.status, machine.attempt) == ("TWO", "running", 4)
    [written] = [h for h in fsm.history(mid) if h.event == "rewind"]
    assert rewound.step == written.attempt == 3  # the step of its own row, not the machine's
    assert machine.context == {
        "ticket": 7,
        "one": 1,
        "draft": "first",
        "hint": "use v2",
        "retryCount": 0,
        "maxRetries": 3,
    }
    rewound = fsm.history(mid)[-1]
    assert (rewound.event, rewound.from_state, rewound.to_state, rewound.actor) == (
        "rewind",
        "THREE",
        "TWO",
        "ops",
    )
    assert rewound.reason == "to step 1: redo TWO with a fix"
    again = agent.task()
    assert (again["state"], again["context"]["hint"]) == ("TWO", "use v2")
    [cancel] = agent.cancels  # THREE's agent is told its attempt was taken away
    assert cancel["attempt"] == abandoned["attempt"] and "rewound by ops" in cancel["reason"]
    fsm.receive(ack(abandoned, output={"three": 3}))  # its late ack: refused, recorded
    assert fsm.rejections(mid)[-1] == "stale_attempt"
    fsm.receive(ack(again, output={"two": 22}))
    fsm.receive(ack(agent.task()))
    assert fsm.machine(mid).status == "completed"
    events = [h.event for h in fsm.history(mid)]  # nothing before the rewind is lost
    assert events == ["start", "ack", "ack", "rewind", "ack", "ack"]


def test_a_finished_machine_rewinds_and_what_cannot_be_rewound_is_refused(fsm: Fsm) -> None:
    from fsm_celery.exceptions import CommandRefused, InvalidContext, StepNotFound

    agent = fsm.agent("tester")
    mid = fsm.start("test_linear")
    for _ in range(3):
        fsm.receive(ack(agent.task()))
    assert fsm.machine(mid).status == "completed"
    with pytest.raises(CommandRefused, match="ended the machine in DONE"):
        fsm.engine.rewind.rewind(mid, 3, "ops", "")
    with pytest.raises(CommandRefused, match="step 9 is not in its past"):
        fsm.engine.rewind.rewind(mid, 9, "ops", "")
    with pytest.raises(InvalidContext, match="maxRetries must be a whole number"):
        fsm.engine.rewind.rewind(mid, 2, "ops", "", {"maxRetries": "many"})
    assert fsm.machine(mid).status == "completed"  # refused: nothing changed
    fsm.enter_all(fsm.engine.rewind.rewind(mid, 2, "ops", "the deploy was rolled back").next)
    machine = fsm.machine(mid)
    assert (machine.current_state, machine.status) == ("THREE", "running")
    assert agent.task()["state"] == "THREE"
    with pytest.raises(StepNotFound):
        fsm.engine.rewind.rewind(mid, -1, "ops", "")


def test_a_fork_starts_from_a_past_step_and_leaves_its_source_alone(fsm: Fsm) -> None:
    from fsm_celery.exceptions import CommandRefused

    agent = fsm.agent("tester")
    source = fsm.start("test_linear", {"ticket": 9})
    fsm.receive(ack(agent.task(), output={"one": 1, "draft": "a"}))  # step 1: -> TWO
    fsm.receive(ack(agent.task(), output={"two": 2}))  # step 2: -> THREE
    three = agent.task()
    before = fsm.machine(source)
    first = fsm.engine.fork.fork(source, 1, "ops", "try another draft", {"draft": "b"})
    fsm.enter_all([first])
    fork = fsm.machine(first.machine_id)
    assert (fork.current_state, fork.status, fork.attempt) == ("TWO", "running", 1)
    assert fork.context["draft"] == "b" and fork.context["one"] == 1 and "two" not in fork.context
    assert (fork.forked_from, fork.forked_at) == (source, 1)
    [started] = fsm.history(first.machine_id)
    assert (started.event, started.actor, started.to_state) == ("fork", "ops", "TWO")
    assert started.reason == f"from {source} step 1: try another draft"
    tasks = agent.tasks()
    assert [(t["machineId"], t["state"]) for t in tasks] == [(str(first.machine_id), "TWO")]
    assert fsm.machine(source) == before  # untouched
    fsm.receive(ack(three))  # the source's THREE: DONE
    with pytest.raises(CommandRefused, match="ended it in DONE"):
        fsm.engine.fork.fork(source, 3, "ops", "")
    completed = fsm.engine.fork.fork(source, 2, "ops", "again from THREE")  # a finished one
    assert fsm.machine(completed.machine_id).current_state == "THREE"


def test_rewind_and_fork_edits_that_break_the_context_schema_are_refused(fsm: Fsm) -> None:
    from fsm_celery.exceptions import CommandRefused

    agent = fsm.agent("tester")
    mid = fsm.start("test_checked", {"ticket": 7})
    fsm.receive(ack(agent.task(), output={"draft": "a"}))  # step 1: -> TWO (an output beside)
    fsm.receive(ack(agent.task()))  # step 2: -> DONE
    before, steps = fsm.machine(mid), len(fsm.history(mid))
    for action in (fsm.engine.rewind.rewind, fsm.engine.fork.fork):
        with pytest.raises(CommandRefused, match="context_schema: at /ticket: 'seven' is not"):
            action(mid, 1, "ops", "", {"ticket": "seven"})
        with pytest.raises(CommandRefused, match="at /ticket: 0 is less than the minimum"):
            action(mid, 1, "ops", "", {"ticket": 0})
    assert fsm.machine(mid) == before and len(fsm.history(mid)) == steps  # nothing changed
    with fsm.engine.db.connect() as conn:  # no fork was started
        assert conn.execute(select(func.count()).select_from(machines)).scalar_one() == 1
    fsm.enter_all(fsm.engine.rewind.rewind(mid, 1, "ops", "", {"ticket": 8, "hint": "b"}).next)
    machine = fsm.machine(mid)
    assert (machine.current_state, machine.context["ticket"]) == ("TWO", 8)
    assert machine.context["draft"] == "a"  # an output kept, though the schema names no draft
    forked = fsm.engine.fork.fork(mid, 1, "ops", "", {"ticket": 9})
    assert fsm.machine(forked.machine_id).context["ticket"] == 9
