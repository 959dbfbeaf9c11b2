"""An operator's command that supersedes an attempt an agent works on sends that agent a
state_cancel, once the command committed; nothing else does."""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from fsm_celery.core.admin import Action, Command
from fsm_celery.core.messages import StateCancel
from fsm_celery.exceptions import CommandRefused
from tests.inprocess.conftest import Fsm, ack


@pytest.mark.parametrize(
    ("command", "then"),
    [
        (Command(Action.PAUSE, "alice", "look first"), []),
        (Command(Action.FORCE, "alice", "skip ahead", "THREE"), [("THREE", 2)]),
        (Command(Action.RETRY, "alice", "again"), [("ONE", 2)]),
        (Command(Action.CANCEL, "alice", "enough"), []),
    ],
    ids=["pause", "force", "retry", "cancel"],
)
def test_a_command_cancels_the_attempt_in_flight_on_its_agents_stream(
    fsm: Fsm, command: Command, then: list[tuple[str, int]]
) -> None:
    agent_id = uuid.uuid4()
    agent = fsm.agent(str(agent_id))
    mid = fsm.start("test_linear", agent_id=agent_id)
    sent = agent.task()
    fsm.engine.admin.command(mid, command)

    assert [(t["state"], t["attempt"]) for t in agent.tasks()] == then
    [cancel] = agent.cancels
    assert cancel == {
        "type": "state_cancel",
        "machineId": str(mid),
        "state": "ONE",
        "attempt": 1,
        "taskToken": sent["taskToken"],  # the one the agent holds: it matches it to its task
        "reason": f"{command.action.value} by alice: {command.reason}",
    }
    StateCancel.model_validate_json(json.dumps(cancel))  # the published schema holds


def test_nothing_is_cancelled_when_no_attempt_is_in_flight(fsm: Fsm) -> None:
    agent = fsm.agent("tester")
    waiting = fsm.start("test_backoff")
    [retry] = fsm.receive(ack(agent.task(), success=False, error="flaky"))
    assert retry.delay > 0  # its next attempt waits out a backoff: not sent yet
    fsm.engine.admin.command(waiting, Command(Action.PAUSE, "ops"))
    paused = fsm.start("test_linear")
    agent.task()
    assert agent.cancels == []
    fsm.engine.admin.command(paused, Command(Action.PAUSE, "ops"))
    assert agent.tasks() == [] and len(agent.cancels) == 1  # this one was in flight
    agent.cancels.clear()

    fsm.engine.admin.command(paused, Command(Action.RESUME, "ops"))  # nothing ran while paused
    with pytest.raises(CommandRefused):  # refused: rolled back, nothing sent
        fsm.engine.admin.command(waiting, Command(Action.PAUSE, "ops"))
    assert [(t["state"], t["attempt"]) for t in agent.tasks()] == [("ONE", 3)]
    assert agent.cancels == []


def test_a_machine_without_an_agent_has_its_cancel_sent_to_its_agent_types_stream(
    fsm: Fsm,
) -> None:
    agent = fsm.agent("tester")
    mid = fsm.start("test_linear")  # no agent alive: its task went to the type's stream
    agent.task()
    fsm.engine.admin.command(mid, Command(Action.PAUSE, "ops", "x" * 5000))
    agent.tasks()
    [cancel] = agent.cancels
    assert (cancel["machineId"], cancel["attempt"]) == (str(mid), 1)
    assert len(cancel["reason"]) == 2000  # bounded, as an agent's own texts are


def test_a_redis_that_cannot_take_the_cancel_fails_no_command(
    fsm: Fsm, caplog: pytest.LogCaptureFixture
) -> None:
    mid = fsm.start("test_linear")
    dispatcher = fsm.engine.runtime.dispatcher
    client = dispatcher._client  # type: ignore[attr-defined]
    dispatcher._client = redis.Redis(port=1, socket_connect_timeout=0.2)  # type: ignore[attr-defined]
    try:
        fsm.engine.admin.command(mid, Command(Action.PAUSE, "ops"))
    finally:
        dispatcher._client = client  # type: ignore[attr-defined]
    assert fsm.machine(mid).status == "paused"
    assert "1 state_cancels not sent" in caplog.text


def test_an_attempt_that_timed_out_is_cancelled_and_its_retry_sent(fsm: Fsm) -> None:
    agent_id = uuid.uuid4()
    agent = fsm.agent(str(agent_id))
    mid = fsm.start("test_timeout", {"who": "the oracle"}, agent_id=agent_id)
    first = agent.task()
    fsm.clock.advance(1.1)
    fsm.scan()
    assert [(t["state"], t["attempt"]) for t in agent.tasks()] == [("WAIT", 2)]
    [cancel] = agent.cancels
    assert (cancel["machineId"], cancel["attempt"], cancel["taskToken"]) == (
        str(mid),
        1,
        first["taskToken"],
    )
    assert cancel["reason"] == "timed out: no ack or heartbeat before its deadline"
