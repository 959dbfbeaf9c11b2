"""Acceptance: heartbeats, carried from agent to engine in each transition mode, keep a state
alive past its timeout. The engine's side (a state timing out once they stop, the progress a
machine shows) is tests/inprocess/test_engine.py's, on the test's clock."""

from __future__ import annotations

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
