"""Fan-out against real PostgreSQL and Redis: children started, joined once, cancelled, in both
modes' shapes (inline: the batch enters what is due; celery: every step handed on)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any
from uuid import UUID, uuid4

import pytest
from sqlalchemy import event, select

from fsm_celery.client import Client
from fsm_celery.core.admin import Action, Command
from fsm_celery.core.loader import load_text
from fsm_celery.core.messages import task_channel
from fsm_celery.engine import Inbound
from fsm_celery.store.tables import agent_type_slots, fan_out_items, fan_outs, machines
from tests.inprocess.conftest import Fsm, ack


def children(fsm: Fsm, parent: UUID) -> list[Any]:
    with fsm.engine.db.connect() as conn:
        return list(
            conn.execute(
                select(machines).where(machines.c.parent_id == parent).order_by(machines.c.slot)
            ).all()
        )


def fan_out(fsm: Fsm, parent: UUID) -> Any:
    with fsm.engine.db.connect() as conn:
        return conn.execute(select(fan_outs).where(fan_outs.c.parent_id == parent)).one()


def slots(fsm: Fsm, parent: UUID) -> list[str]:
    with fsm.engine.db.connect() as conn:
        rows = conn.execute(
            select(fan_out_items.c.status)
            .where(fan_out_items.c.parent_id == parent)
            .order_by(fan_out_items.c.slot)
        ).all()
    return [r.status for r in rows]


def test_parallel_branches_go_to_their_own_agent_types_and_join_once(fsm: Fsm) -> None:
    writer, docwriter = fsm.agent("writer"), fsm.agent("docwriter")
    mid = fsm.start("test_fan_parallel", {"repo": "sla"})
    [tests_task], [docs_task] = writer.tasks(), docwriter.tasks()
    assert tests_task["machineType"] == "test_fan_parallel.BUILD.tests"
    assert tests_task["context"]["repo"] == "sla"  # a branch sees its parent's context
    kids = children(fsm, mid)
    assert [(k.branch, k.agent_type, k.depth, k.root_id) for k in kids] == [
        ("tests", "writer", 1, mid),
        ("docs", "docwriter", 1, mid),
    ]
    assert fsm.receive(ack(docs_task, output={"pages": 3})) == []
    assert fsm.machine(mid).current_state == "BUILD"  # one branch of two: no join yet
    answer = ack(tests_task, output={"suite": "ok"})
    assert fsm.receive(answer, answer) == []  # redelivered in the same batch
    assert fsm.receive(answer) == []  # and again later: stale
    parent = fsm.machine(mid)
    assert (parent.current_state, parent.status) == ("SHIP", "running")
    assert parent.context["tests"] == {"suite": "ok"}
    assert parent.context["docs"] == {"pages": 3}
    joins = [h for h in fsm.history(mid) if h.event == "join"]
    assert len(joins) == 1 and joins[0].to_state == "SHIP"
    assert fan_out(fsm, mid).verdict == "met" and fan_out(fsm, mid).decided_by == kids[0].id
    [ship] = fsm.agent("tester").tasks()
    assert ship["state"] == "SHIP"


def test_in_the_celery_shape_every_child_and_the_join_are_handed_on(fsm: Fsm) -> None:
    [first] = fsm.engine.admin.start("test_fan_parallel", {}).next
    started = fsm.engine.entry.enter(first.machine_id, first.attempt)
    assert sorted(s.machine_type for s in started) == [
        "test_fan_parallel.BUILD.docs",
        "test_fan_parallel.BUILD.tests",
    ]
    fsm.enter_all(started)
    [t1], [t2] = fsm.agent("writer").tasks(), fsm.agent("docwriter").tasks()
    inbox = fsm.engine.inbox
    assert inbox.apply([Inbound(json.dumps(ack(t1, output={"suite": 1})))]) == []
    [joined] = inbox.apply([Inbound(json.dumps(ack(t2, output={"pages": 1})))])
    assert (joined.machine_id, joined.state) == (first.machine_id, "SHIP")


def test_children_entered_together_skip_one_held_elsewhere_and_enter_it_alone(fsm: Fsm) -> None:
    """A transaction entering several children never waits for one while holding another (a
    join holding their parent may be locking them all): it enters those free, commits, and then
    waits for the held one in a transaction of its own."""
    [first] = fsm.engine.admin.start("test_fan_parallel", {}).next
    steps = [(s.machine_id, s.attempt) for s in fsm.engine.entry.enter(*first[:2])]
    free, held = sorted(steps)  # the held one the later in the lock order
    with fsm.engine.db.connect() as holder, holder.begin() as tx:
        holder.execute(select(machines.c.id).where(machines.c.id == held[0]).with_for_update())
        entering = threading.Thread(target=fsm.engine.entry.enter_many, args=(steps,))
        entering.start()
        deadline = time.monotonic() + 10
        while fsm.machine(free[0]).status == "running" and _due(fsm, free[0]):
            assert time.monotonic() < deadline, "the free child was not entered"
            time.sleep(0.01)
        assert entering.is_alive()  # waiting, alone, for the held child
        assert _due(fsm, held[0])
        tx.rollback()
    entering.join(10)
    assert not entering.is_alive()
    assert not _due(fsm, held[0])
    assert len(fsm.agent("writer").tasks()) == len(fsm.agent("docwriter").tasks()) == 1


def _due(fsm: Fsm, machine_id: UUID) -> bool:
    """Whether the machine's state is still to be entered (its dispatch due)."""
    with fsm.engine.db.connect() as conn:
        row = conn.execute(select(machines).where(machines.c.id == machine_id)).one()
    return row.dispatch_due_at is not None


@pytest.mark.parametrize("store", ["fsm", "fsm_unprepared", "fsm_sqlite"])
def test_a_map_runs_its_items_two_at_a_time_and_collects_results_in_order(
    store: str, request: pytest.FixtureRequest
) -> None:
    """On each store's statements: PostgreSQL's prepared, the same sent whole (behind a
    pooler), SQLite's."""
    fsm: Fsm = request.getfixturevalue(store)
    agent = fsm.agent("tester")
    mid = fsm.start("test_fan_map", {"items": ["a", "b", "c", "d"], "prefix": "p"})
    first = agent.tasks()
    assert [t["context"]["item"] for t in first] == ["a", "b"]
    assert first[0]["context"]["prefix"] == "p" and "items" not in first[0]["context"]
    assert slots(fsm, mid) == ["running", "running", "waiting", "waiting"]
    fsm.receive(ack(first[1], output={"answer": "B"}))  # the second ends first
    [c] = agent.tasks()
    assert c["context"]["item"] == "c"
    fsm.receive(ack(first[0], success=False, error="no source"))  # one failure: tolerated
    [d] = agent.tasks()
    fsm.receive(ack(d, output={"answer": "D"}), ack(c, output={"answer": "C"}))
    parent = fsm.machine(mid)
    assert (parent.current_state, parent.status) == ("DONE", "completed")
    results = parent.context["results"]
    assert results[1:] == [{"answer": "B"}, {"answer": "C"}, {"answer": "D"}]
    assert results[0]["status"] == "failed" and "no source" in results[0]["error"]


def test_an_any_join_cancels_the_losers_and_refuses_their_late_acks(fsm: Fsm) -> None:
    agent = fsm.agent("tester")
    mid = fsm.start("test_fan_any", {})
    a, b, c = agent.tasks()
    fsm.receive(ack(b, output={"won": True}))
    parent = fsm.machine(mid)
    assert (parent.status, parent.context["b"]) == ("completed", {"won": True})
    assert parent.context["a"] == {"status": "cancelled", "error": "cancelled by the join"}
    kids = children(fsm, mid)
    assert [k.status for k in kids] == ["cancelled", "completed", "cancelled"]
    assert agent.tasks() == []  # nothing new to do: the losers' agents are told to stop
    assert {m["machineId"] for m in agent.cancels} == {a["machineId"], c["machineId"]}
    fsm.receive(ack(a, output={"late": 1}))
    assert fsm.rejections(kids[0].id) == ["stale_attempt"]  # its attempt was cancelled
    assert [h.event for h in fsm.history(mid)].count("join") == 1


def test_a_child_machine_returns_its_fields_and_its_spending_counts_for_its_parent(
    fsm: Fsm,
) -> None:
    agent = fsm.agent("tester")
    mid = fsm.start("test_fan_child", {"left": "L", "unrelated": 1})
    [first] = agent.tasks()
    assert first["machineType"] == "test_pair"
    assert {k: first["context"][k] for k in ("left",)} == {"left": "L"}
    assert "unrelated" not in first["context"]
    fsm.receive(ack(first, output={"first": 1, "tokensUsed": 40}))
    assert fsm.machine(mid).tokens_used == 40  # rolled up to the parent as it is spent
    [second] = agent.tasks()
    fsm.receive(ack(second, output={"second": 2, "tokensUsed": 30}))
    parent = fsm.machine(mid)
    assert (parent.status, parent.tokens_used) == ("completed", 70)
    assert parent.context["first"] == 1 and parent.context["second"] == 2


def test_a_budget_exhausted_mid_fan_out_cancels_the_child_and_pauses_the_parent(
    fsm: Fsm,
) -> None:
    agent = fsm.agent("tester")
    mid = fsm.start("test_fan_child", {"left": "L"})
    [first] = agent.tasks()
    fsm.receive(ack(first, output={"first": 1, "tokensUsed": 150}))  # past the parent's 100
    parent = fsm.machine(mid)
    assert (parent.status, parent.current_state) == ("failed", "FAILED")
    assert parent.tokens_used == 150 and "budget" in (parent.error or "")
    [kid] = children(fsm, mid)
    assert kid.status == "cancelled"


def test_cancelling_a_root_reaches_its_grandchildren(fsm: Fsm) -> None:
    agent = fsm.agent("tester")
    root = fsm.start("test_fan_tree", {"left": "L"})
    [task] = agent.tasks()
    [child] = children(fsm, root)
    [grandchild] = children(fsm, child.id)
    assert str(grandchild.id) == task["machineId"] and grandchild.root_id == root
    fsm.engine.admin.command(root, Command(Action.PAUSE, "ops"))
    assert fsm.machine(child.id).status == "paused"
    assert fsm.machine(grandchild.id).status == "paused"
    fsm.engine.admin.command(root, Command(Action.RESUME, "ops"))
    assert fsm.machine(grandchild.id).status == "running"
    [again] = agent.tasks()  # the grandchild's state dispatched again, once
    assert again["machineId"] == str(grandchild.id) and again["attempt"] > task["attempt"]
    fsm.engine.admin.command(root, Command(Action.CANCEL, "ops", "wrong issue"))
    assert [fsm.machine(m).status for m in (root, child.id, grandchild.id)] == ["cancelled"] * 3
    history = fsm.history(grandchild.id)
    assert history[-1].event == "cancel" and history[-1].actor == "parent"


def test_an_agent_types_bound_queues_entries_in_postgresql_and_frees_them_in_order(
    fsm: Fsm,
) -> None:
    agent = fsm.agent("limited")
    mid = fsm.start("test_fan_limit", {"items": [0, 1, 2, 3, 4]})
    first = agent.tasks()
    assert [t["context"]["item"] for t in first] == [0, 1]  # the bound, not max_concurrency
    kids = children(fsm, mid)
    queued = [k for k in kids if k.queued_at is not None]
    assert [k.slot for k in queued] == [2, 3, 4]
    assert all(k.deadline_at is None for k in queued)  # no timeout runs while queued
    fsm.clock.advance(25)
    fsm.scan()  # counts what is in flight again: the same
    assert agent.tasks() == []
    fsm.receive(ack(first[1]))  # frees a slot, entered in the same transaction
    [third] = agent.tasks()
    assert third["context"]["item"] == 2
    fsm.receive(ack(first[0]), ack(third))
    rest = agent.tasks()
    assert [t["context"]["item"] for t in rest] == [3, 4]
    fsm.receive(*(ack(t) for t in rest))
    assert fsm.machine(mid).status == "completed"
    with fsm.engine.db.connect() as conn:
        row = conn.execute(
            select(agent_type_slots).where(agent_type_slots.c.agent_type == "limited")
        ).one()
    assert (row.max_in_flight, row.in_flight) == (2, 0)


def test_a_queued_machine_shows_its_place_in_its_agent_types_queue(fsm: Fsm) -> None:
    mid = fsm.start("test_fan_limit", {"items": [0, 1, 2, 3]})
    kids = children(fsm, mid)
    client = Client(fsm.engine, fsm.enter_all)
    places = [client.get_machine(k.id).queue_position for k in kids]
    assert places == [None, None, 1, 2]
    assert client.get_machine(kids[2].id).to_dict()["queued_at"] is not None


def test_children_without_an_agent_go_to_their_types_channel_and_stream_and_losers_cancels_to_the_stream_only(  # noqa: E501
    fsm: Fsm,
) -> None:
    channel = fsm.redis.pubsub(ignore_subscribe_messages=True)
    channel.subscribe(task_channel("tester", fsm.settings.channel_prefix))
    channel.get_message(timeout=1.0)  # the subscription's confirmation
    agent = fsm.agent("tester")
    mid = fsm.start("test_fan_any", {})
    streamed = agent.tasks()
    assert {t["machineType"] for t in streamed} == {f"test_fan_any.RACE.{b}" for b in "abc"}
    assert [k.agent_id for k in children(fsm, mid)] == [None, None, None]  # no agent assigned
    fsm.receive(ack(streamed[1], output={"won": True}))
    assert fsm.machine(mid).status == "completed"
    assert agent.tasks() == [] and len(agent.cancels) == 2  # the losers' cancels: the stream
    published = []
    while (message := channel.get_message(timeout=0.5)) is not None:
        published.append(json.loads(message["data"]))
    channel.close()
    assert [m["type"] for m in published] == ["state_task"] * 3  # and no state_cancel
    assert [m["machineId"] for m in published] == [t["machineId"] for t in streamed]


def test_children_go_to_a_live_agent_of_their_type_when_one_reported_in(fsm: Fsm) -> None:
    agent_id = uuid4()
    report = {"type": "agent_status", "agentId": str(agent_id), "agentType": "tester"}
    fsm.receive({**report, "status": "active", "concurrency": 4})
    mid = fsm.start("test_fan_any", {})
    assert len(fsm.agent(str(agent_id)).tasks()) == 3
    assert fsm.agent("tester").tasks() == []
    assert [k.agent_id for k in children(fsm, mid)] == [agent_id] * 3


RETRIED_MAP = """\
type: test_fan_retried
agent_type: tester
initial_state: EACH
states:
  - name: EACH
    timeout: 10m
    map:
      items: context.items
      max_concurrency: 3
      tolerated_failures: 1
      initial_state: WORK
      states:
        - {{name: WORK, timeout: 30s, max_retries: 1, {retry_on}backoff: {{delay: 0}},
           on_success: DONE, on_failure: FAILED}}
        - {{name: DONE, terminal: completed}}
        - {{name: FAILED, terminal: failed}}
    on_success: DONE
    on_failure: FAILED
  - {{name: DONE, terminal: completed}}
  - {{name: FAILED, terminal: failed}}
"""


@pytest.mark.parametrize(
    ("retry_on", "answers_to_fail"), [("", 2), ("retry_on: [timeout], ", 1)], ids=["all", "timeout"]
)
def test_a_childs_failure_is_retried_as_its_state_says_before_it_counts_against_the_map(
    fsm: Fsm, retry_on: str, answers_to_fail: int
) -> None:
    """docs/definitions.md: a child's success: false is retried max_retries times (as its
    state's retry_on says) and only a child that ends failed counts against tolerated_failures."""
    fsm.engine.catalog.load([load_text(RETRIED_MAP.format(retry_on=retry_on))])
    agent = fsm.agent("tester")
    mid = fsm.start("test_fan_retried", {"items": ["a", "b", "c"]})
    first, second, _ = agent.tasks()
    for child in (first, second):
        task = child
        for answer in range(answers_to_fail):
            assert fan_out(fsm, mid).failed == (0 if child is first else 1)
            fsm.receive(ack(task, success=False, error="no"))
            if answer + 1 < answers_to_fail:
                [task] = agent.tasks()  # the same child, its next attempt
                assert (task["machineId"], task["attempt"]) == (child["machineId"], 2)
        if child is first:
            assert fan_out(fsm, mid).failed == 1
            assert fsm.machine(mid).current_state == "EACH"  # one failure tolerated
    parent = fsm.machine(mid)
    assert (parent.current_state, parent.status) == ("FAILED", "failed")  # the second: past it


def test_a_batch_of_children_is_written_by_one_statement_each_not_one_a_child(
    fsm_unprepared: Fsm,
) -> None:
    """docs/fan-out.md: the children a transaction starts, their start records and their slots
    are each one statement over them (counted on PostgreSQL with the statements sent whole, so
    that each is seen by its text), however many children."""
    fsm = fsm_unprepared
    seen: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        # a driver's executemany is a statement a row, however SQLAlchemy hands it over
        seen.append(("MANY " if many else "") + " ".join(statement.split()))

    def counted(prefix: str) -> int:
        return sum(statement.startswith(prefix) for statement in seen)

    agent = fsm.agent("tester")
    event.listen(fsm.engine.db, "before_cursor_execute", note)
    try:
        mid = fsm.start("test_fan_map", {"items": list("abcdef"), "prefix": "p"})
        first = agent.tasks()
        assert len(first) == 2  # max_concurrency
        assert counted("INSERT INTO fan_out_items") == 1  # six slots
        assert counted("INSERT INTO state_machines") == 2  # the parent, then its two children
        seen.clear()
        fsm.receive(*(ack(task, output={"answer": "x"}) for task in first))  # two ends at once
        assert len(agent.tasks()) == 2  # two more started
        assert counted("INSERT INTO state_machines") == 1
        assert counted("INSERT INTO state_transitions") == 1  # their start records
        assert counted("UPDATE fan_out_items") == 2  # the two ends, then the two starts
        assert not [statement for statement in seen if statement.startswith("MANY")]
    finally:
        event.remove(fsm.engine.db, "before_cursor_execute", note)
    assert fsm.machine(mid).status == "running"
