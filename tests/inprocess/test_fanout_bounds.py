"""A fan-out is bounded as a whole, not only child by child: a map's shared input is stored
once, the children's starting contexts together are bounded by FSM_MAX_FANOUT_BYTES before
anything is written, and children's spending saturates in their ancestors' totals."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from sqlalchemy import func, select

from fsm_celery.core.usage import MAX_TOKENS
from fsm_celery.store.tables import fan_out_items, fan_outs, machines
from tests.inprocess.conftest import Agent, Fsm, ack


def _fan_out_rows(fsm: Fsm, parent: UUID) -> tuple[list[Any], list[Any], int]:
    """The parent's fan-out rows, its slots' inputs in order, and how many children it has."""
    with fsm.engine.db.connect() as conn:
        opened = conn.execute(select(fan_outs).where(fan_outs.c.parent_id == parent)).all()
        inputs = conn.execute(
            select(fan_out_items.c.input)
            .where(fan_out_items.c.parent_id == parent)
            .order_by(fan_out_items.c.slot)
        ).scalars()
        children = conn.execute(
            select(func.count()).select_from(machines).where(machines.c.parent_id == parent)
        ).scalar_one()
    return list(opened), list(inputs), children


def _started(task: dict[str, Any]) -> tuple[Any, Any]:
    return task["context"].get("prefix"), task["context"].get("item")


def test_a_maps_shared_input_is_stored_once_and_every_child_still_starts_with_it(
    fsm: Fsm,
) -> None:
    agent = fsm.agent("tester")
    prefix = "p" * 100_000
    mid = fsm.start("test_fan_map", {"items": ["a", "b", "c"], "prefix": prefix})
    [fan_out], inputs, _ = _fan_out_rows(fsm, mid)
    assert fan_out.shared == {"prefix": prefix}  # once, on the fan-out
    assert inputs == [{"item": "a"}, {"item": "b"}, {"item": "c"}]  # each slot its own part
    first, second = agent.tasks()
    assert [_started(t) for t in (first, second)] == [(prefix, "a"), (prefix, "b")]
    fsm.receive(ack(first, output={"answer": "A"}))
    [third] = agent.tasks()  # started later, from its slot and the shared input
    assert _started(third) == (prefix, "c")
    fsm.receive(ack(second, output={"answer": "B"}), ack(third, output={"answer": "C"}))
    parent = fsm.machine(mid)
    assert parent.status == "completed"
    # what each child hands back is what it added: the shared input is not handed back
    assert parent.context["results"] == [{"answer": "A"}, {"answer": "B"}, {"answer": "C"}]


def test_an_answer_planning_past_the_fan_out_bound_fails_its_state_and_others_go_on(
    fsm: Fsm,
) -> None:
    """The issue's attack: a planning agent answers 1,000 short sub-questions and a 400 KB
    query that every child's input copies (400 MB planned). In the same batch an honest
    machine's answer is applied and its children's tasks go out; the attack's map state fails
    by its failure edge with the reason, having written no fan-out, slot or child."""
    analyzer, researcher = fsm.agent("analyzer"), fsm.agent("researcher")
    attacked = fsm.start("research_fanout", {"query": "anything"})
    honest = fsm.start("research_fanout", {"query": "why is the sky blue"})
    planning = {t["machineId"]: t for t in analyzer.tasks()}
    attack = ack(
        planning[str(attacked)],
        output={"subQuestions": [f"q{i}" for i in range(1000)], "query": "x" * 400_000},
    )
    answer = ack(planning[str(honest)], output={"subQuestions": ["light", "air"]})
    fsm.receive(attack, answer)
    tasks = researcher.tasks()
    assert sorted(t["context"]["subQuestion"] for t in tasks) == ["air", "light"]
    with fsm.engine.db.connect() as conn:
        ids = conn.execute(select(machines.c.id).where(machines.c.parent_id == honest)).scalars()
        assert {t["machineId"] for t in tasks} == {str(i) for i in ids}
    assert fsm.machine(honest).current_state == "RESEARCHING"
    refused = fsm.machine(attacked)
    assert (refused.status, refused.current_state) == ("failed", "FAILED")
    assert "RESEARCHING" in (refused.error or "")
    assert "FSM_MAX_FANOUT_BYTES=67108864" in (refused.error or "")
    assert _fan_out_rows(fsm, attacked) == ([], [], 0)


def test_a_fan_out_under_its_bound_with_a_lower_setting_is_refused_past_it(fsm: Fsm) -> None:
    fsm.engine.runtime.settings = fsm.settings.model_copy(update={"max_fanout_bytes": 100})
    mid = fsm.start("test_fan_map", {"items": list(range(10)), "prefix": "p" * 20})
    refused = fsm.machine(mid)
    assert (refused.status, refused.current_state) == ("failed", "FAILED")
    assert "10 children's starting contexts would take" in (refused.error or "")
    assert _fan_out_rows(fsm, mid) == ([], [], 0)


def _answer_all(fsm: Fsm, agent: Agent, output: dict[str, Any]) -> int:
    """Answer every task the agent has until none is left; how many were answered."""
    answered = 0
    while tasks := agent.tasks():
        fsm.receive(*(ack(task, output=output) for task in tasks))
        answered += len(tasks)
    return answered


def test_children_spending_the_most_a_machine_may_saturates_their_parents_total(
    fsm: Fsm,
) -> None:
    """1,100 children each reporting the most tokens a machine may spend: their sum passes
    BIGINT after 1,025 of them; the parent's total saturates and its join happens."""
    mid = fsm.start("test_fan_hundred", {"items": list(range(1100))})
    answered = _answer_all(fsm, fsm.agent("tester"), {"tokensUsed": MAX_TOKENS})
    assert answered == 1100
    parent = fsm.machine(mid)
    assert (parent.status, parent.current_state) == ("completed", "DONE")
    assert parent.tokens_used == MAX_TOKENS
    assert fsm.rejections() == []
