"""Every committed transition is announced on channel:state:events, and nothing else is."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from fsm_celery.core.admin import Action, Command
from fsm_celery.core.messages import StateEvent, events_channel
from fsm_celery.exceptions import CommandRefused
from tests.inprocess.conftest import Fsm, ack
from tests.support.messages import FIX_BUG_STATES

CONTEXT = {"projectName": "sla-api", "bugDescription": "login fails", "githubIssue": 7}


class Listener:
    """A subscriber of the events channel, as the dashboard is."""

    def __init__(self, fsm: Fsm) -> None:
        self._pubsub = fsm.redis.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(events_channel(fsm.settings.channel_prefix))
        self._pubsub.get_message(timeout=1.0)  # the subscription's confirmation

    def events(self, quiet: float = 0.3) -> list[dict[str, Any]]:
        """What arrived until the channel stayed quiet for `quiet` seconds."""
        found = []
        deadline = time.monotonic() + quiet
        while time.monotonic() < deadline:
            message = self._pubsub.get_message(timeout=0.05)
            if message is not None:
                found.append(json.loads(message["data"]))
                deadline = time.monotonic() + quiet
        return found

    def close(self) -> None:
        self._pubsub.close()


@pytest.fixture
def listener(fsm: Fsm) -> Iterator[Listener]:
    listening = Listener(fsm)
    yield listening
    listening.close()


def test_each_transition_is_announced_once_in_order_as_its_history_row(
    fsm: Fsm, listener: Listener
) -> None:
    agent_id = uuid.uuid4()
    agent = fsm.agent(str(agent_id))
    mid = fsm.start("cto_fix_bug", CONTEXT, agent_id=agent_id)
    while (tasks := agent.tasks()) and fsm.machine(mid).status == "running":
        fsm.receive(ack(tasks[0]))
    events = listener.events()

    history = fsm.history(mid)
    assert [e["toState"] for e in events] == FIX_BUG_STATES
    assert [(e["attempt"], e["fromState"], e["toState"], e["event"]) for e in events] == [
        (h.attempt, h.from_state, h.to_state, h.event) for h in history
    ]
    assert [e["status"] for e in events] == ["running"] * (len(events) - 1) + ["completed"]
    assert [e["durationMs"] for e in events] == [h.duration_ms for h in history]  # live = read
    assert [e["stateRetries"] for e in events] == [0] * len(events)
    assert {
        (e["machineId"], e["machineType"], e["agentType"], e["githubIssue"]) for e in events
    } == {(str(mid), "cto_fix_bug", "cto", 7)}
    for event in events:
        StateEvent.model_validate_json(json.dumps(event))  # the published schema holds


def test_an_operators_command_is_announced_with_who_and_a_refused_one_is_not(
    fsm: Fsm, listener: Listener
) -> None:
    mid = fsm.start("test_linear")
    listener.events()  # the start
    fsm.engine.admin.command(mid, Command(Action.PAUSE, "alice", "look first"))
    with pytest.raises(CommandRefused):  # its transaction rolls back
        fsm.engine.admin.command(mid, Command(Action.PAUSE, "bob", "again"))

    [paused] = listener.events()
    assert (paused["event"], paused["status"], paused["actor"]) == ("pause", "paused", "alice")
    assert paused["machineId"] == str(mid)


def test_a_redis_that_cannot_take_the_events_fails_no_transition(
    fsm: Fsm, caplog: pytest.LogCaptureFixture
) -> None:
    dispatcher = fsm.engine.runtime.dispatcher
    client = dispatcher._client  # type: ignore[attr-defined]
    dispatcher._client = redis.Redis(port=1, socket_connect_timeout=0.2)  # type: ignore[attr-defined]
    try:
        [first] = fsm.engine.admin.start("test_linear").next  # a start sends nothing but its event
    finally:
        dispatcher._client = client  # type: ignore[attr-defined]
    assert fsm.machine(first.machine_id).status == "running"
    assert "1 transition events not announced" in caplog.text


def test_a_childs_events_name_its_parent_and_its_root(fsm: Fsm, listener: Listener) -> None:
    root = fsm.start("test_fan_tree", {"left": "L"})
    events = listener.events()
    by_machine = {e["machineId"]: e for e in events}
    assert by_machine[str(root)]["parentId"] is None and by_machine[str(root)]["rootId"] is None
    children = [e for e in events if e["parentId"] is not None]
    assert len(children) == 2  # the child's start and the grandchild's
    [child] = [e for e in children if e["parentId"] == str(root)]
    [grandchild] = [e for e in children if e["parentId"] == child["machineId"]]
    assert child["rootId"] == grandchild["rootId"] == str(root)
    for event in events:
        StateEvent.model_validate_json(json.dumps(event))
