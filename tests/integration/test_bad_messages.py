"""Acceptance: every kind of bad message changes no machine, is recorded with its reason, and
the worker and bridge keep serving."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from fsm_celery.core.messages import task_token
from tests.integration.conftest import ONE_MODE
from tests.support.agents import ScriptedAgent
from tests.support.credentials import TEST_SECRET
from tests.support.messages import SILENT, ack_for, heartbeat_for
from tests.support.processes import FsmEnv

Task = dict[str, Any]


def _forged(task: Task) -> Task:
    return {**ack_for(task), "taskToken": "f" * 64}


def _tokenless(task: Task) -> Task:
    return {k: v for k, v in ack_for(task).items() if k != "taskToken"}


def _wrong_state(task: Task) -> Task:
    token = task_token(TEST_SECRET, task["machineId"], "FIRST", task["attempt"])
    return {**ack_for(task), "state": "FIRST", "taskToken": token}


def _stale(task: Task) -> Task:
    attempt = task["attempt"] - 1
    token = task_token(TEST_SECRET, task["machineId"], task["state"], attempt)
    return {**ack_for(task), "attempt": attempt, "taskToken": token}


def _future(task: Task) -> Task:
    attempt = task["attempt"] + 5
    token = task_token(TEST_SECRET, task["machineId"], task["state"], attempt)
    return {**ack_for(task), "attempt": attempt, "taskToken": token}


def _unknown_machine(task: Task) -> Task:
    ghost = str(uuid.uuid4())
    token = task_token(TEST_SECRET, ghost, task["state"], task["attempt"])
    return {**ack_for(task), "machineId": ghost, "taskToken": token}


BAD: list[tuple[str, Callable[[Task], str | Task], str]] = [
    ("malformed JSON", lambda t: '{"type": "state_ack", "machineId": ', "malformed_json"),
    ("not an object", lambda t: "[1, 2, 3]", "schema_violation"),
    ("unknown type", lambda t: {**ack_for(t), "type": "state_nack"}, "schema_violation"),
    ("success not a bool", lambda t: {**ack_for(t), "success": "maybe"}, "schema_violation"),
    (
        "state missing",
        lambda t: {k: v for k, v in ack_for(t).items() if k != "state"},
        "schema_violation",
    ),
    ("machineId not a uuid", lambda t: {**ack_for(t), "machineId": "m-123"}, "schema_violation"),
    ("output not an object", lambda t: {**ack_for(t), "output": ["x"]}, "schema_violation"),
    # past the limit, but not by more than an entry's field names: the bridge's read script
    # parks an entry further over without loading it (tests/integration/test_oversized.py)
    ("oversized", lambda t: {**ack_for(t), "output": {"blob": "x" * 2**20}}, "oversized"),
    ("forged token", _forged, "bad_token"),
    ("missing token", _tokenless, "bad_token"),
    (
        "heartbeat with forged token",
        lambda t: {**heartbeat_for(t), "taskToken": "0" * 64},
        "bad_token",
    ),
    ("wrong state", _wrong_state, "wrong_state"),
    ("stale attempt", _stale, "stale_attempt"),
    ("attempt never dispatched", _future, "unknown_attempt"),
]


@pytest.mark.parametrize("via_stream", [False, True], ids=["pubsub", "stream"])
@ONE_MODE
def test_bad_messages_change_nothing_and_are_recorded(fsm: FsmEnv, via_stream: bool) -> None:
    with ScriptedAgent(fsm, {"SECOND": [SILENT]}, via_stream=via_stream) as agent:
        mid = fsm.client.start_machine("test_pair", {}, agent_id=agent.id)
        fsm.wait_for_state(mid, "SECOND")
        task = agent.wait_for_tasks(2)
        before = fsm.client.get_machine(mid)
        after_id = _last_rejection_id(fsm)
        for _, make, _ in BAD:
            agent.send(make(task))
        expected = [reason for _, _, reason in BAD]
        found = _rejections_since(fsm, after_id, len(expected))
        assert sorted(r["reason"] for r in found) == sorted(expected)
        after = fsm.client.get_machine(mid)
        assert (after.current_state, after.attempt, after.status, after.context) == (
            before.current_state,
            before.attempt,
            before.status,
            before.context,
        )
        assert len(fsm.client.history(mid)) == 2
        agent.send(ack_for(task))  # the worker and the bridge still serve
        assert fsm.wait_until_done(mid).status == "completed"


def _last_rejection_id(env: FsmEnv) -> int:
    return max((r["id"] for r in env.client.rejected(limit=1)), default=0)


def _rejections_since(env: FsmEnv, after_id: int, count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + 15
    while len(found) < count and time.monotonic() < deadline:
        time.sleep(0.05)
        found = [r for r in env.client.rejected(limit=1000) if r["id"] > after_id]
    return found


def test_oversized_payload_is_stored_truncated(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"FIRST": [SILENT]}) as agent:
        fsm.client.start_machine("test_pair", {}, agent_id=agent.id)
        task = agent.wait_for_tasks(1)
        after_id = _last_rejection_id(fsm)
        agent.send({**ack_for(task), "output": {"blob": "y" * 2_000_000}})
        [rejected] = _rejections_since(fsm, after_id, 1)
    assert rejected["machine_id"] is None  # too big to read: nothing of it is trusted
    assert rejected["reason"] == "oversized"
    assert len(rejected["payload"]) <= 4096
    assert "1048576 bytes" in rejected["detail"]


@ONE_MODE
def test_missing_required_output_is_refused_then_fails_the_attempt_naming_the_keys(
    fsm: FsmEnv,
) -> None:
    with ScriptedAgent(fsm, {"FIRST": [SILENT]}) as agent:
        mid = fsm.client.start_machine("test_pair", {}, agent_id=agent.id)
        task = agent.wait_for_tasks(1)
        for _ in range(3):  # two refusals (FSM_MAX_CORRECTIONS), then the attempt's failure
            agent.send({**ack_for(task), "output": {"unrelated": True}})
        assert fsm.wait_until_done(mid).status == "completed"
        [rejected] = fsm.wait_for_rejections(mid, 1)
    history = fsm.client.history(mid)
    assert [h.event for h in history[1:3]] == ["refused", "refused"]
    assert "'first' is a required property" in (history[1].error_message or "")
    first_attempt = history[3]
    assert (first_attempt.from_state, first_attempt.to_state) == ("FIRST", "FIRST")
    assert not first_attempt.success
    assert "missing required output: first" in (first_attempt.error_message or "")
    assert rejected["reason"] == "invalid_output"
    assert "first" in rejected["detail"]
    assert [t["state"] for t in agent.tasks] == ["FIRST", "FIRST", "SECOND"]


@ONE_MODE
def test_acks_for_paused_or_cancelled_machines_are_refused_and_recorded(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"FIRST": [SILENT, SILENT]}) as agent:
        paused = fsm.client.start_machine("test_pair", {}, agent_id=agent.id)
        cancelled = fsm.client.start_machine("test_pair", {}, agent_id=agent.id)
        agent.wait_for_tasks(2)
        tasks = {t["machineId"]: t for t in agent.tasks}
        fsm.client.pause(paused, actor="test", reason="hold on")
        fsm.client.cancel(cancelled, actor="test", reason="not needed")
        for mid in (paused, cancelled):
            agent.send(ack_for(tasks[str(mid)]))
        for mid, status in ((paused, "paused"), (cancelled, "cancelled")):
            [rejected] = fsm.wait_for_rejections(mid, 1)
            assert rejected["reason"] == "stale_attempt"  # the command ended that attempt
            assert fsm.client.get_machine(mid).status == status
            assert fsm.client.get_machine(mid).current_state == "FIRST"


def test_seed_agents_without_token_are_refused_unless_allowed(
    env_factory: Callable[..., FsmEnv],
) -> None:
    seed_era = env_factory("seed_era", accept_unsigned_acks=True)
    seed_era.start_worker()
    seed_era.start_bridge()
    with ScriptedAgent(seed_era, {"FIRST": [SILENT]}) as agent:
        mid = seed_era.client.start_machine("test_pair", {}, agent_id=agent.id)
        task = agent.wait_for_tasks(1)
        seed_ack = {k: v for k, v in ack_for(task).items() if k not in ("taskToken", "attempt")}
        agent.send(json.dumps(seed_ack))
        assert seed_era.wait_until_done(mid).status == "completed"
    seed_era.stop_all()
