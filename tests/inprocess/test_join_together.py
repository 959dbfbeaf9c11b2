"""A join's record is one truth, whatever one transaction brings together (DESIGN.md invariant
10): children that end in the transaction that meets the join are counted as what they are,
in the fan-out's counts, their slots and the output merged into the parent, and are not the
join's losers; the losers are cancelled without completing."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import select

from fsm_celery.engine import Inbound
from fsm_celery.store.tables import fan_out_items, fan_outs, machines
from tests.inprocess.conftest import Fsm, ack

Apply = Callable[[Fsm, list[dict[str, Any]]], None]
# what a child's slot says, by the status its machine ended with
ENDED_AS = {"completed": "succeeded", "failed": "failed", "cancelled": "cancelled"}


def _inline(fsm: Fsm, answers: list[dict[str, Any]]) -> None:
    """The batch applied in one transaction, due states entered in it (the inline mode)."""
    fsm.receive(*answers)


def _celery(fsm: Fsm, answers: list[dict[str, Any]]) -> None:
    """The batch applied as one group-commit round of fsm.apply_acks (the tasks' acks in one
    transaction, nothing sent), then the states it handed on entered as their tasks would."""
    fsm.enter_all(fsm.engine.inbox.apply([Inbound(json.dumps(a)) for a in answers]))


SHAPES = {"inline": _inline, "celery": _celery}


def _row(fsm: Fsm, table: Any, parent: UUID) -> Any:
    with fsm.engine.db.connect() as conn:
        return conn.execute(select(table).where(table.c.parent_id == parent)).one()


def _slots(fsm: Fsm, parent: UUID) -> list[str]:
    c = fan_out_items.c
    with fsm.engine.db.connect() as conn:
        rows = conn.execute(select(c.status).where(c.parent_id == parent).order_by(c.slot)).all()
    return [r.status for r in rows]


def _children(fsm: Fsm, parent: UUID) -> dict[str, Any]:
    with fsm.engine.db.connect() as conn:
        rows = conn.execute(select(machines).where(machines.c.parent_id == parent)).all()
    return {r.branch: r for r in rows}


def _by_type(tasks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["machineType"]: t for t in tasks}


@pytest.mark.parametrize("order", ["sibling first", "nested first"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_nested_branch_completed_with_the_sibling_that_meets_the_join_is_a_success(
    fsm: Fsm, shape: str, order: str
) -> None:
    """An at_least 2 race of three: one branch succeeded; then in one transaction its sibling
    succeeds (meeting the join) and the third branch, a parent of a one-item map, completes by
    its own join (its item's answer). That branch counts as the success it is, everywhere."""
    agent = fsm.agent("tester")
    mid = fsm.start("test_fan_race", {"items": ["only"], "prefix": "p"})
    tasks = _by_type(agent.tasks())
    fsm.receive(ack(tasks["test_fan_race.RACE.a"], output={"a": 1}))  # one of two: no join
    assert fsm.machine(mid).current_state == "RACE"
    sibling = ack(tasks["test_fan_race.RACE.b"], output={"b": 2})
    item = ack(tasks["test_fan_map.EACH"], output={"answer": "A"})
    SHAPES[shape](fsm, [sibling, item] if order == "sibling first" else [item, sibling])

    parent = fsm.machine(mid)
    assert (parent.status, parent.current_state) == ("completed", "DONE")
    assert parent.context["c"] == {"results": [{"answer": "A"}]}  # its result, not "cancelled"
    nested = _children(fsm, mid)["c"]
    assert nested.status == "completed"
    assert "cancel" not in [h.event for h in fsm.history(nested.id)]
    agent.tasks()  # reads the state_cancels sent, too
    assert str(nested.id) not in {m["machineId"] for m in agent.cancels}
    assert _slots(fsm, mid) == ["succeeded"] * 3
    counts = _row(fsm, fan_outs, mid)
    assert (counts.verdict, counts.succeeded, counts.failed) == ("met", 3, 0)
    [join] = [h for h in fsm.history(mid) if h.event == "join"]
    assert "3 succeeded, 0 failed" in (join.reason or "")
    assert "cancelled by the join" not in (join.reason or "")
    inner = _row(fsm, fan_outs, nested.id)
    assert (inner.verdict, inner.succeeded, inner.closed_at is not None) == ("met", 1, True)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_branch_ending_in_the_transaction_that_meets_the_join_is_counted(
    fsm: Fsm, shape: str
) -> None:
    """At_least 2 of four, three answering in one transaction: the three are counted and
    merged, and only the fourth, still out, is the join's loser."""
    agent = fsm.agent("tester")
    mid = fsm.start("test_fan_at_least", {})
    tasks = _by_type(agent.tasks())
    answers = [ack(tasks[f"test_fan_at_least.RACE.{b}"], output={b: 1}) for b in "bca"]
    SHAPES[shape](fsm, answers)

    parent = fsm.machine(mid)
    assert parent.status == "completed"
    assert [parent.context[b] for b in "abc"] == [{"a": 1}, {"b": 1}, {"c": 1}]
    assert parent.context["d"] == {"status": "cancelled", "error": "cancelled by the join"}
    assert _slots(fsm, mid) == ["succeeded"] * 3 + ["cancelled"]
    counts = _row(fsm, fan_outs, mid)
    assert (counts.verdict, counts.succeeded, counts.failed) == ("met", 3, 0)
    assert [k.status for _, k in sorted(_children(fsm, mid).items())] == ["completed"] * 3 + [
        "cancelled"
    ]
    assert agent.tasks() == []  # the join sent no new work, only the loser's state_cancel
    loser = tasks["test_fan_at_least.RACE.d"]["machineId"]
    assert {m["machineId"] for m in agent.cancels} == {loser}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_an_answer_that_meets_the_join_and_spends_past_the_budget_is_counted_first(
    fsm: Fsm, shape: str
) -> None:
    """The item's answer completes the nested branch (meeting the race with the first branch)
    and takes the parent past its budget of 100 tokens: the budget is judged once that end is
    counted, so the join is met with the branch's result, as an agent's answer that spends past
    a machine's budget still moves it on, and the one loser is the branch still at work."""
    agent = fsm.agent("tester")
    mid = fsm.start("test_fan_race", {"items": ["only"], "prefix": "p"})
    tasks = _by_type(agent.tasks())
    fsm.receive(ack(tasks["test_fan_race.RACE.a"], output={"a": 1}))
    item = ack(tasks["test_fan_map.EACH"], output={"answer": "A", "tokensUsed": 150})
    SHAPES[shape](fsm, [item])

    parent = fsm.machine(mid)
    assert (parent.status, parent.current_state, parent.tokens_used) == ("completed", "DONE", 150)
    assert parent.context["c"] == {"results": [{"answer": "A", "tokensUsed": 150}]}
    assert parent.context["b"] == {"status": "cancelled", "error": "cancelled by the join"}
    kids = _children(fsm, mid)
    assert {b: k.status for b, k in kids.items()} == {
        "a": "completed",
        "b": "cancelled",
        "c": "completed",
    }
    assert _slots(fsm, mid) == ["succeeded", "cancelled", "succeeded"]
    counts = _row(fsm, fan_outs, mid)
    assert (counts.verdict, counts.succeeded, counts.failed) == ("met", 2, 0)
    [join] = [h for h in fsm.history(mid) if h.event == "join"]
    assert (join.reason or "").endswith(
        "2 succeeded, 0 failed, 1 cancelled by the join; decided by " + str(kids["c"].id)
    )


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_an_answer_past_two_ancestors_budgets_ends_the_nearer_before_the_farther_joins(
    fsm: Fsm, shape: str
) -> None:
    """A grandchild's answer spends past its parent's budget and its grandparent's: the parent's
    join fails and the parent fails, and that end is counted in the grandparent's join (a
    failure), not recorded there as a child the join cancelled."""
    agent = fsm.agent("tester")
    root = fsm.start("test_fan_budgets", {"left": "L"})
    [task] = agent.tasks()
    SHAPES[shape](fsm, [ack(task, output={"first": 1, "tokensUsed": 150})])

    middle = _children(fsm, root)["0"]
    assert fsm.machine(middle.id).status == "failed"
    assert "budget" in (fsm.machine(middle.id).error or "")
    assert "cancel" not in [h.event for h in fsm.history(middle.id)]
    assert fsm.machine(root).status == "failed"
    assert _slots(fsm, root) == ["failed"]
    counts = _row(fsm, fan_outs, root)
    assert (counts.verdict, counts.succeeded, counts.failed) == ("failed", 0, 1)
    [join] = [h for h in fsm.history(root) if h.event == "join"]
    assert "0 succeeded, 1 failed" in (join.reason or "")
    assert "cancelled by the join" not in (join.reason or "")


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_whatever_arrives_together_every_join_record_agrees(
    fsm: Fsm, shape: str, seed: int
) -> None:
    """Twelve races whose answers (some failures) arrive in random batches: every fan-out's
    counts, slots, children and merged output agree, at both levels."""
    rng = random.Random(seed)
    agent = fsm.agent("tester")
    roots = [
        fsm.start("test_fan_race", {"items": [f"{i}.{k}" for k in range(1 + i % 2)], "prefix": "p"})
        for i in range(12)
    ]
    tasks = agent.tasks()
    while tasks:
        rng.shuffle(tasks)
        while tasks:
            size = rng.randint(1, 8)
            batch, tasks = tasks[:size], tasks[size:]
            SHAPES[shape](fsm, [_answer(task, rng.random() < 0.8) for task in batch])
        tasks = agent.tasks()
    for root in roots:
        assert fsm.machine(root).status in ("completed", "failed")
        _assert_one_truth(fsm, root)
        _assert_one_truth(fsm, _children(fsm, root)["c"].id)


def _answer(task: dict[str, Any], success: bool) -> dict[str, Any]:
    if not success:
        return ack(task, success=False, error="no luck")
    return ack(task, output={"answer": task["machineId"][:8]})


def _assert_one_truth(fsm: Fsm, parent: UUID) -> None:
    """The fan-out's counts are its slots' ends, each slot says how its child's machine ended,
    and the parent's output (a met join) holds each branch's slot as it is."""
    c = fan_out_items.c
    with fsm.engine.db.connect() as conn:
        slots = conn.execute(select(fan_out_items).where(c.parent_id == parent)).all()
    fan_out = _row(fsm, fan_outs, parent)
    if fan_out.verdict == "pending":
        return  # a nested branch cancelled before its own join: nothing decided to agree with
    statuses = [s.status for s in slots]
    assert (fan_out.succeeded, fan_out.failed) == (
        statuses.count("succeeded"),
        statuses.count("failed"),
    ), (parent, statuses)
    kids = {k.id: k for k in _children(fsm, parent).values()}
    for s in slots:
        if s.child_id is not None:
            assert ENDED_AS[kids[s.child_id].status] == s.status, (parent, s.slot)
    machine = fsm.machine(parent)
    if fan_out.verdict == "met" and machine.type == "test_fan_race":
        for s, branch in zip(sorted(slots, key=lambda s: s.slot), "abc", strict=True):
            value = machine.context[branch]
            if s.status == "succeeded":
                assert value == s.result, (parent, branch)
            else:
                assert value["status"] == s.status, (parent, branch, value)
