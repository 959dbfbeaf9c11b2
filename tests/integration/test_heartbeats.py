"""Acceptance: heartbeats keep a state alive past its timeout; when they stop, it times out."""

from __future__ import annotations

import time

from tests.integration.conftest import ONE_MODE
from tests.support.agents import ScriptedAgent
from tests.support.messages import Reply
from tests.support.processes import FsmEnv


def test_heartbeats_keep_a_state_alive_past_its_timeout(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"LONG": [Reply(heartbeat_for=4.0)]}) as agent:
        mid = fsm.client.start_machine("test_heartbeat", {}, agent_id=agent.id)
        info = fsm.wait_until_done(mid, timeout=20)
    assert info.status == "completed"
    [_start, ack] = fsm.client.history(mid)
    assert (ack.event, ack.from_state, ack.to_state, ack.success) == ("ack", "LONG", "DONE", True)
    assert (ack.duration_ms or 0) >= 4000  # twice the state's two-second timeout
    assert ack.progress is not None and ack.progress.endswith("s to go")


@ONE_MODE
def test_a_state_times_out_once_its_heartbeats_stop(fsm: FsmEnv) -> None:
    script = {"LONG": [Reply(heartbeat_for=3.0, silent=True)]}
    with ScriptedAgent(fsm, script) as agent:
        mid = fsm.client.start_machine("test_heartbeat", {}, agent_id=agent.id)
        info = fsm.wait_until_done(mid, timeout=20)
    assert info.status == "failed"
    last = fsm.client.history(mid)[-1]
    assert (last.event, last.from_state, last.to_state) == ("timeout", "LONG", "FAILED")
    # heartbeats for about three seconds, then timed out 1.5 s (heartbeat_timeout) later
    assert 4000 <= (last.duration_ms or 0) <= 8000
    assert last.progress is not None


@ONE_MODE
def test_progress_is_visible_on_the_machine_while_it_works(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"LONG": [Reply(heartbeat_for=2.0)]}) as agent:
        mid = fsm.client.start_machine("test_heartbeat", {}, agent_id=agent.id)
        agent.wait_for_tasks(1)
        seen = None
        for _ in range(100):
            info = fsm.client.get_machine(mid)
            if info.progress:
                seen = info
                break
            time.sleep(0.05)
        assert seen is not None and seen.heartbeat_at is not None
        assert seen.progress.endswith("s to go")
        fsm.wait_until_done(mid, timeout=20)
    done = fsm.client.get_machine(mid)
    assert (done.progress, done.heartbeat_at) == (None, None)
