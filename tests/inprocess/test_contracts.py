"""Output contracts (DESIGN.md, invariant 12): an answer that breaks its state's contract goes
back to its agent as a state_ack_refused naming each problem, the machine where it was (same
attempt, same deadline), a history row recording the refusal; a corrected answer within the
attempt moves it on, and past max_corrections a wrong one is the attempt's failure. The same in
both transition modes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from uuid import UUID

import pytest

from fsm_celery.core.contract import MAX_PROBLEMS, MESSAGE_CHARS
from fsm_celery.engine import Inbound, Next
from fsm_celery.store import agents as agent_store
from fsm_celery.store import queries as q
from fsm_celery.store.rows import AgentReport
from tests.inprocess.conftest import Agent, Fsm, ack

GOOD = {"passed": True, "score": 7}
BAD = {"passed": "yes", "score": 11}

Receive = Callable[[Fsm, dict[str, Any]], Next]


def _inline(fsm: Fsm, message: dict[str, Any]) -> Next:
    return fsm.receive(message)


def _celery(fsm: Fsm, message: dict[str, Any]) -> Next:
    """As fsm.apply_acks applies a batch; the states it hands on entered as their tasks do."""
    decided = fsm.engine.inbox.apply([Inbound(json.dumps(message))])
    fsm.enter_all(decided)
    return decided


MODES = pytest.mark.parametrize("receive", [_inline, _celery], ids=["inline", "celery"])


def _started(fsm: Fsm) -> tuple[UUID, Agent, dict[str, Any]]:
    agent = fsm.agent("tester")
    mid = fsm.start("test_contract")
    return mid, agent, agent.task()


@MODES
def test_a_wrong_answer_is_refused_and_the_machine_stays_in_its_attempt(
    fsm: Fsm, receive: Receive
) -> None:
    mid, agent, task = _started(fsm)
    before = fsm.machine(mid)
    receive(fsm, ack(task, output=BAD))
    after = fsm.machine(mid)
    assert (after.current_state, after.attempt, after.status) == ("CHECK", 1, "running")
    assert after.deadline_at == before.deadline_at  # the same deadline runs on
    [refused] = [h for h in fsm.history(mid) if h.event == "refused"]
    assert (refused.from_state, refused.to_state, refused.attempt) == ("CHECK", "CHECK", 1)
    assert refused.output == BAD
    assert "/passed" in (refused.error_message or "")
    assert agent.tasks() == []  # no new task: the same attempt
    [message] = agent.refusals
    assert message["type"] == "state_ack_refused"
    assert (message["machineId"], message["machineType"]) == (str(mid), "test_contract")
    assert (message["state"], message["attempt"]) == ("CHECK", 1)
    assert message["taskToken"] == task["taskToken"]
    assert message["correctionsLeft"] == 1
    pointers = {p["pointer"] for p in message["problems"]}
    assert pointers == {"/passed", "/score"}
    assert fsm.rejections(mid) == []  # recorded as a refusal, not as a rejected message


@MODES
def test_a_corrected_answer_within_the_attempt_moves_the_machine_on(
    fsm: Fsm, receive: Receive
) -> None:
    mid, _, task = _started(fsm)
    receive(fsm, ack(task, output=BAD))
    receive(fsm, ack(task, output=GOOD))  # the same attempt, the same token
    done = fsm.machine(mid)
    assert (done.current_state, done.status) == ("DONE", "completed")
    events = [(h.event, h.attempt, h.to_state) for h in fsm.history(mid)]
    assert events == [("start", 0, "CHECK"), ("refused", 1, "CHECK"), ("ack", 1, "DONE")]


@MODES
def test_past_max_corrections_a_wrong_answer_is_the_attempts_failure(
    fsm: Fsm, receive: Receive
) -> None:
    mid, agent, task = _started(fsm)
    for _ in range(2):  # the state's max_corrections
        receive(fsm, ack(task, output=BAD))
    assert agent.tasks() == []
    assert [m["correctionsLeft"] for m in agent.refusals] == [1, 0]
    receive(fsm, ack(task, output=BAD))
    failed = fsm.history(mid)[-1]
    assert (failed.event, failed.success, failed.attempt) == ("ack", False, 1)
    assert "breaks its contract" in (failed.error_message or "")
    retry = fsm.machine(mid)
    assert (retry.current_state, retry.attempt, retry.status) == ("CHECK", 2, "running")
    assert fsm.rejections(mid) == ["invalid_output"]
    # the retry's attempt starts with its corrections again
    [second] = agent.tasks()
    receive(fsm, ack(second, output=BAD))
    assert agent.tasks() == []
    assert (agent.refusals[-1]["attempt"], agent.refusals[-1]["correctionsLeft"]) == (2, 1)
    with fsm.engine.db.connect() as conn:
        row = q.get_machine_txn(conn, mid)
    assert row is not None and row.corrections == 1  # counted on the machine, not read back


def test_a_refusal_of_a_stale_attempt_is_a_rejection_not_a_refusal(fsm: Fsm) -> None:
    mid, agent, task = _started(fsm)
    fsm.receive(ack(task, output=GOOD))
    fsm.receive(ack(task, output=BAD))
    assert agent.refusals == []
    assert fsm.rejections(mid) == ["stale_attempt"]


def test_a_refusal_with_huge_problems_stays_bounded(fsm: Fsm) -> None:
    mid, agent, task = _started(fsm)
    huge = {"passed": True, "notes": [n * 1000 for n in range(500)]}  # 500 wrong items
    fsm.receive(ack(task, output=huge))
    assert agent.tasks() == []
    [message] = agent.refusals
    assert len(message["problems"]) == MAX_PROBLEMS
    assert all(len(p["message"]) <= MESSAGE_CHARS for p in message["problems"])
    assert len(json.dumps(message)) < 20_000
    [refused] = [h for h in fsm.history(mid) if h.event == "refused"]
    assert len(refused.error_message or "") <= 2100
    assert fsm.machine(mid).current_state == "CHECK"


def test_the_state_task_carries_its_contract(fsm: Fsm) -> None:
    _, _, task = _started(fsm)
    schema = task["outputSchema"]
    assert schema["required"] == ["passed"]
    assert schema["properties"]["passed"] == {"type": "boolean"}


def test_a_state_without_a_schema_sends_none_and_missing_keys_are_refused(fsm: Fsm) -> None:
    agent = fsm.agent("tester")
    mid = fsm.start("test_linear")
    task = agent.task()
    assert "outputSchema" not in task
    fsm.receive(ack(task, output={"other": 1}))
    assert agent.tasks() == []
    [message] = agent.refusals
    assert message["problems"] == [{"pointer": "", "message": "'one' is a required property"}]
    fsm.receive(ack(task))
    assert fsm.machine(mid).current_state == "TWO"


def test_a_refusal_goes_to_the_agent_that_sent_the_answer(fsm: Fsm) -> None:
    mid, types_stream, task = _started(fsm)  # taken from its agent type's stream
    sender = UUID(int=7)
    now = fsm.clock()
    with fsm.engine.db.begin() as conn:  # an agent of the type, answering from its own stream
        report = AgentReport(sender, "tester", "active", 1, 0, None, now, now)
        agent_store.upsert_agents_txn(conn, [report])
    fsm.receive(ack(task, output=BAD), agent=sender)
    own = fsm.agent(str(sender))
    own.tasks()
    [message] = own.refusals
    assert message["machineId"] == str(mid)
    types_stream.tasks()
    assert types_stream.refusals == []  # another agent of the type would not hold the task
