"""Acceptance: a silent agent's state times out, is retried, then takes its failure edge."""

from __future__ import annotations

from tests.integration.harness import SILENT, FsmEnv, ScriptedAgent


def test_silent_state_times_out_is_retried_then_takes_its_failure_edge(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"WAIT": [SILENT, SILENT]}) as agent:
        mid = fsm.client.start_machine("test_timeout", {"who": "Godot"}, agent_id=agent.id)
        info = fsm.wait_until_done(mid, timeout=20)
    assert info.status == "completed"
    rows = [(r.event, r.from_state, r.to_state, r.success) for r in fsm.client.history(mid)]
    assert rows == [
        ("start", None, "WAIT", True),
        ("timeout", "WAIT", "WAIT", False),
        ("timeout", "WAIT", "FALLBACK", False),
        ("ack", "FALLBACK", "DONE", True),
    ]
    assert list(agent.states()) == ["WAIT", "WAIT", "FALLBACK"]
    assert agent.tasks[0]["prompt"] == "Wait for Godot."
    history = fsm.client.history(mid)
    assert history[1].error_message == "timed out (retry 1 of 1)"
    assert (history[1].duration_ms or 0) >= 1000
