"""Acceptance: every ack is applied at most once; bad acks change nothing and are recorded."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

from fsm_celery.core.messages import ack_channel, task_token
from fsm_celery.engine import EnterNow, Entry, Inbound, Inbox
from tests.integration.conftest import ONE_MODE
from tests.support.agents import ScriptedAgent
from tests.support.credentials import TEST_SECRET
from tests.support.messages import FIX_BUG_STATES, SILENT, Reply, ack_for
from tests.support.processes import FsmEnv

CONTEXT = {"projectName": "sla-api", "githubIssue": 7}


def _wait_for_task(agent: ScriptedAgent, count: int = 1) -> dict[str, Any]:
    deadline = time.monotonic() + 15
    while len(agent.tasks) < count:
        assert time.monotonic() < deadline, "no state_task arrived"
        time.sleep(0.02)
    return agent.tasks[count - 1]


def test_each_ack_published_three_times_is_applied_once(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, copies=3) as agent:
        mid = fsm.client.start_machine("cto_fix_bug", CONTEXT, agent_id=agent.id)
        assert fsm.wait_until_done(mid).status == "completed"
        rejected = fsm.wait_for_rejections(mid, 12)
    history = fsm.client.history(mid)
    assert [r.to_state for r in history] == FIX_BUG_STATES
    assert [r.attempt for r in history] == list(range(len(FIX_BUG_STATES)))
    assert len(rejected) == 12  # two extra copies of each of the six acks
    assert {r["reason"] for r in rejected} == {"stale_attempt"}
    assert len(agent.tasks) == 6  # and no state was dispatched twice


def test_two_different_acks_for_one_attempt_make_one_transition(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"ANALYZE_BUG": [SILENT]}) as agent:
        mid = fsm.client.start_machine("cto_fix_bug", CONTEXT, agent_id=agent.id)
        task = _wait_for_task(agent)
        acks = [json.dumps(ack_for(task)), json.dumps(ack_for(task, Reply(success=False)))]
        go = threading.Barrier(2)
        channel = ack_channel(fsm.settings.channel_prefix)

        def publish(ack: str) -> None:
            go.wait()
            fsm.redis.publish(channel, ack)

        threads = [threading.Thread(target=publish, args=(a,)) for a in acks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rejected = fsm.wait_for_rejections(mid, 1)
        fsm.wait_until_done(mid)
    history = fsm.client.history(mid)
    assert [r.attempt for r in history] == list(range(len(history)))
    assert len([r for r in history if r.attempt == 1]) == 1
    assert [r["reason"] for r in rejected] == ["stale_attempt"]


@ONE_MODE  # both transactions are the test's own, on the engine
def test_concurrent_batches_for_one_attempt_lock_the_row(fsm: FsmEnv) -> None:
    """Two transactions racing on the same attempt: the row lock lets exactly one apply."""
    with ScriptedAgent(fsm, {"ANALYZE_BUG": [SILENT]}) as agent:
        mid = fsm.client.start_machine("cto_fix_bug", CONTEXT, agent_id=agent.id)
        task = _wait_for_task(agent)
    good = json.dumps(ack_for(task))
    bad = json.dumps(ack_for(task, Reply(success=False, error="no")))
    go = threading.Barrier(2)
    results: list[object] = []
    runtime = fsm.client.engine.runtime
    inbox = Inbox(runtime, Entry(runtime, EnterNow()))  # the inline mode's, on the engine

    def apply(payload: str) -> None:
        go.wait()
        results.append(inbox.apply([Inbound(payload)]))

    threads = [threading.Thread(target=apply, args=(p,)) for p in (good, bad)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    history = fsm.client.history(mid)
    assert len([r for r in history if r.attempt == 1]) == 1
    # The loser decides nothing; the winner's next state is entered in its transaction after
    # the success, or handed on (a retry after its backoff) after the failure. Either may win.
    succeeded = fsm.client.get_machine(mid).current_state == "LOCATE_CODE"
    assert sorted(len(r) for r in results) == ([0, 0] if succeeded else [0, 1])
    assert [r["reason"] for r in fsm.client.rejected(mid)] == ["stale_attempt"]


@ONE_MODE
def test_ack_for_an_unknown_machine_is_recorded_and_changes_nothing(fsm: FsmEnv) -> None:
    ghost = uuid.uuid4()
    before = fsm.client.stats()
    ack = {
        "type": "state_ack",
        "machineId": str(ghost),
        "state": "ANALYZE_BUG",
        "success": True,
        "output": {},
        "attempt": 1,
        "taskToken": task_token(TEST_SECRET, ghost, "ANALYZE_BUG", 1),
    }
    fsm.redis.publish(ack_channel(fsm.settings.channel_prefix), json.dumps(ack))
    rejected = fsm.wait_for_rejections(ghost, 1)
    assert [(r["reason"], r["machine_id"]) for r in rejected] == [("unknown_machine", str(ghost))]
    assert fsm.client.stats()["machines"] == before["machines"]


@ONE_MODE
def test_ack_with_a_forged_token_changes_nothing(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"ANALYZE_BUG": [SILENT]}) as agent:
        mid = fsm.client.start_machine("cto_fix_bug", CONTEXT, agent_id=agent.id)
        task = _wait_for_task(agent)
        forged = {**ack_for(task), "taskToken": "0" * 64}
        fsm.redis.publish(ack_channel(fsm.settings.channel_prefix), json.dumps(forged))
        rejected = fsm.wait_for_rejections(mid, 1)
    assert [r["reason"] for r in rejected] == ["bad_token"]
    machine = fsm.client.get_machine(mid)
    assert (machine.current_state, machine.attempt) == ("ANALYZE_BUG", 1)
    assert len(fsm.client.history(mid)) == 1
